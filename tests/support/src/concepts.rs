//! A toy "semantic" embedding model for scripted embeddings endpoints: words of one synonym
//! group share a direction, every other word hashes into directions of its own. So a
//! paraphrase that shares no word with its original still lands next to it, which no
//! lexical method can do — what a test needs to tell that an answer came by the vector
//! path. Deterministic, and the same in every test that uses it. [`ConceptProvider`] serves
//! it as an embeddings endpoint's script that can be taken down and counts what it
//! embedded.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{Reply, Request};

/// The synonym groups; group `g` owns dimension `g`.
const GROUPS: &[&[&str]] = &[
    &["automobile", "car", "sedan", "vehicle"],
    &["bought", "purchased", "acquired", "buy"],
    &["physician", "doctor", "medic", "clinician"],
    &["canine", "dog", "puppy", "hound"],
    &["holiday", "vacation", "trip", "getaway"],
    &["melody", "song", "tune", "music"],
];

/// The vectors' dimension: the groups, then as many hashed dimensions again.
pub const DIMENSIONS: usize = 16;

/// The unit vector of `text`.
pub fn concepts(text: &str) -> Vec<f32> {
    let mut v = vec![0f32; DIMENSIONS];
    let hashed = DIMENSIONS - GROUPS.len();
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let word = word.to_lowercase();
        match GROUPS.iter().position(|g| g.contains(&word.as_str())) {
            Some(g) => v[g] += 1.0,
            None => {
                // FNV-1a: stable across runs and platforms.
                let h = word.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                });
                v[GROUPS.len() + (h % hashed as u64) as usize] += 0.5;
            }
        }
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    } else {
        v[DIMENSIONS - 1] = 1.0;
    }
    v
}

/// An embeddings provider serving [`concepts`]: `Endpoint::start(move |r| p.answer(r))`.
/// While down it answers 503 to everything; it counts, per text, the embeddings it gave.
#[derive(Debug, Default)]
pub struct ConceptProvider {
    down: AtomicBool,
    embedded: Mutex<HashMap<String, usize>>,
}

impl ConceptProvider {
    /// Takes the provider down (503 "the model is loading") or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// The script: vectors of [`concepts`], or 503 while down.
    pub fn answer(&self, request: &Request) -> Reply {
        if self.down.load(Ordering::SeqCst) {
            return Reply::error(503, "the model is loading");
        }
        let mut embedded = self.embedded.lock().unwrap_or_else(|p| p.into_inner());
        for text in request.inputs() {
            *embedded.entry(text).or_default() += 1;
        }
        request.embedded_by(concepts)
    }

    /// How many times `text` was embedded (answered with a vector).
    pub fn times_embedded(&self, text: &str) -> usize {
        self.embedded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(text)
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cos(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn a_paraphrase_is_nearer_than_an_unrelated_text() {
        let original = concepts("we bought a sedan");
        let paraphrase = concepts("acquired automobile");
        let other = concepts("the weather at the beach was sunny");
        assert!(cos(&original, &paraphrase) > 0.6);
        assert!(cos(&original, &paraphrase) > cos(&original, &other) + 0.4);
        assert!((cos(&original, &original) - 1.0).abs() < 1e-5);
    }
}
