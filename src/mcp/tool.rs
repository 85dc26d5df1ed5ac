//! The tools by their contract names (docs/mcp.md), each with the admission class its calls
//! take over HTTP, so a name is matched once, where a call arrives, and never again as text.

use crate::admission::WorkClass;

/// One of the MCP tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// Record one event or a batch.
    Remember,
    /// Ranked, explained memories for a query.
    Recall,
    /// Credit or blame a recall's memories, or memories named.
    Feedback,
    /// Archive a memory.
    Forget,
    /// Set a memory's status.
    Mark,
    /// A session's records, newest first.
    Timeline,
    /// The namespace's sessions.
    Sessions,
    /// Search the knowledge pool.
    KnowledgeSearch,
    /// The knowledge graph around a record.
    KnowledgeGraph,
    /// Condense a session's recent window now.
    Condense,
}

impl Tool {
    /// Every tool, in the order they are listed to a client.
    pub const ALL: [Tool; 10] = [
        Tool::Remember,
        Tool::Recall,
        Tool::Feedback,
        Tool::Forget,
        Tool::Mark,
        Tool::Timeline,
        Tool::Sessions,
        Tool::KnowledgeSearch,
        Tool::KnowledgeGraph,
        Tool::Condense,
    ];

    /// The contract's name of the tool.
    pub fn name(self) -> &'static str {
        match self {
            Tool::Remember => "remember",
            Tool::Recall => "recall",
            Tool::Feedback => "feedback",
            Tool::Forget => "forget",
            Tool::Mark => "mark",
            Tool::Timeline => "timeline",
            Tool::Sessions => "sessions",
            Tool::KnowledgeSearch => "knowledge_search",
            Tool::KnowledgeGraph => "knowledge_graph",
            Tool::Condense => "condense",
        }
    }

    /// The tool a client's call names, if there is one by that name.
    pub fn named(name: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The admission slot a call takes over HTTP, as the `/v1` route it mirrors does; `None`
    /// for the light reads no route bounds either (a timeline, the session list, the graph).
    pub(crate) fn work(self) -> Option<WorkClass> {
        match self {
            Tool::Recall | Tool::KnowledgeSearch => Some(WorkClass::Recall),
            Tool::Remember | Tool::Feedback | Tool::Forget | Tool::Mark | Tool::Condense => {
                Some(WorkClass::Write)
            }
            Tool::Timeline | Tool::Sessions | Tool::KnowledgeGraph => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back_to_its_tool() {
        for tool in Tool::ALL {
            assert_eq!(Tool::named(tool.name()), Some(tool));
        }
        assert_eq!(Tool::named("Recall"), None, "names are matched exactly");
    }
}
