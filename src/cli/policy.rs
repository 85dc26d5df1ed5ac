//! `shadowbrain policy check FILE`: compiles a policy file exactly as `serve --policy`
//! would (with the `SHADOWBRAIN_POLICY__…` environment overrides) and prints the result —
//! its name, content hash and every setting resolved, as TOML (a complete policy file that
//! compiles to the same hash) or as the JSON of `GET /v1/policy` — or every error found,
//! each with its key and how to fix it, and a non-zero exit.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use serde_json::Value;
use shadowbrain::policy::Policy;

/// `shadowbrain policy …`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy file: print the compiled policy, or every error with its fix.
    Check {
        /// The policy file (TOML).
        file: PathBuf,
        /// Print `{"name","hash","policy"}` as `GET /v1/policy` does, instead of TOML.
        #[arg(long)]
        json: bool,
    },
}

pub(super) fn run(command: PolicyCommand) -> anyhow::Result<()> {
    match command {
        PolicyCommand::Check { file, json } => {
            // `PolicyErrors` lists every issue as `file: `key`: reason`, one per line.
            let policy = Policy::load(&file)?;
            let compiled = policy.to_json();
            let text = if json {
                serde_json::to_string_pretty(&shadowbrain::api::PolicyOut {
                    name: policy.name.clone(),
                    hash: policy.hash.clone(),
                    policy: compiled,
                    namespaces: Default::default(),
                })?
            } else {
                format!(
                    "# {} compiles: policy `{}`, hash {}.\n# Every setting, defaults filled \
                     in (this text compiles to the same hash):\n{}",
                    file.display(),
                    policy.name,
                    policy.hash,
                    toml_text(&compiled)?
                )
            };
            super::out(text.trim_end())
        }
    }
}

/// A compiled policy (a JSON object) as TOML, written by the `toml` crate so that every
/// string is escaped as TOML wants it (JSON's escapes are not enough: TOML also escapes
/// U+007F). TOML has no null, so a null setting is left out, which is what "unset" means in
/// a policy file.
fn toml_text(value: &Value) -> anyhow::Result<String> {
    toml::to_string(&without_nulls(value.clone()))
        .context("writing the compiled policy as TOML (use --json instead)")
}

fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .filter(|v| !v.is_null())
                .map(without_nulls)
                .collect(),
        ),
        other => other,
    }
}
