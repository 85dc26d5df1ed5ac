//! Where each singleton actor is now. The root writes an entry every time it starts (or
//! restarts) a child; the handle and the session actors read it on every send, so a
//! restarted actor is reached at once and nobody keeps an address that died.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use ractor::ActorRef;
use shadowbrain_runtime::{Error, Result};

use crate::condenser::CondenserMessage;
use crate::decay::DecayMessage;
use crate::evaluator::EvaluatorMessage;
use crate::knowledge::KnowledgeMessage;
use crate::session::SessionSupervisorMessage;

/// The current addresses (shared; cheap to clone).
#[derive(Clone, Default)]
pub(crate) struct Directory {
    entries: Arc<RwLock<Entries>>,
    /// A wake-up is in the evaluator's mailbox: further writes need not send another, so
    /// the mailbox never fills with wake-ups while a slow judge works through a round.
    evaluator_woken: Arc<AtomicBool>,
}

#[derive(Default)]
struct Entries {
    sessions: Option<ActorRef<SessionSupervisorMessage>>,
    condenser: Option<ActorRef<CondenserMessage>>,
    evaluator: Option<ActorRef<EvaluatorMessage>>,
    decay: Option<ActorRef<DecayMessage>>,
    knowledge: Option<ActorRef<KnowledgeMessage>>,
}

fn missing(what: &str) -> Error {
    Error::Unavailable {
        what: what.to_string(),
        message: "it is not running (starting, restarting or shut down)".into(),
    }
}

impl Directory {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Entries> {
        self.entries.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Entries> {
        self.entries.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn sessions(&self) -> Result<ActorRef<SessionSupervisorMessage>> {
        self.read()
            .sessions
            .clone()
            .ok_or_else(|| missing("the session supervisor"))
    }

    pub fn condenser(&self) -> Result<ActorRef<CondenserMessage>> {
        self.read()
            .condenser
            .clone()
            .ok_or_else(|| missing("the condenser"))
    }

    /// Asks the condenser to condense `key`'s recent window, without waiting for it (the
    /// session's own trigger, and callers that must not wait for an LLM summarizer).
    pub fn condense_later(&self, key: &crate::session::SessionKey) -> Result<()> {
        self.condenser()?
            .send_message(CondenserMessage::Condense {
                key: key.clone(),
                reply: None,
            })
            .map_err(|e| Error::Unavailable {
                what: "the condenser".into(),
                message: e.to_string(),
            })
    }

    pub fn evaluator(&self) -> Result<ActorRef<EvaluatorMessage>> {
        self.read()
            .evaluator
            .clone()
            .ok_or_else(|| missing("the evaluator"))
    }

    pub fn set_evaluator(&self, actor: ActorRef<EvaluatorMessage>) {
        self.write().evaluator = Some(actor);
    }

    /// Wakes the evaluator unless a wake-up is already waiting in its mailbox.
    pub fn wake_evaluator(&self) {
        if self.evaluator_woken.swap(true, Ordering::AcqRel) {
            return;
        }
        let sent = self
            .evaluator()
            .is_ok_and(|e| e.send_message(EvaluatorMessage::Wake).is_ok());
        if !sent {
            // Not running (restarting, shut down): its start-up wakes it instead.
            self.evaluator_woken.store(false, Ordering::Release);
        }
    }

    /// The flag behind [`Directory::wake_evaluator`], which the evaluator clears when it
    /// takes a wake-up.
    pub fn evaluator_woken(&self) -> Arc<AtomicBool> {
        self.evaluator_woken.clone()
    }

    pub fn decay(&self) -> Result<ActorRef<DecayMessage>> {
        self.read()
            .decay
            .clone()
            .ok_or_else(|| missing("the decay actor"))
    }

    pub fn knowledge(&self) -> Result<ActorRef<KnowledgeMessage>> {
        self.read()
            .knowledge
            .clone()
            .ok_or_else(|| missing("the knowledge graph"))
    }

    pub fn set_knowledge(&self, actor: ActorRef<KnowledgeMessage>) {
        self.write().knowledge = Some(actor);
    }

    pub fn set_sessions(&self, actor: ActorRef<SessionSupervisorMessage>) {
        self.write().sessions = Some(actor);
    }

    pub fn set_condenser(&self, actor: ActorRef<CondenserMessage>) {
        self.write().condenser = Some(actor);
    }

    pub fn set_decay(&self, actor: ActorRef<DecayMessage>) {
        self.write().decay = Some(actor);
    }

    /// Forgets every address (shutdown).
    pub fn clear(&self) {
        *self.write() = Entries::default();
    }
}
