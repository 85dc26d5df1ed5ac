//! `shadowbrain policy check FILE`: compiles a policy file exactly as `serve --policy`
//! would (with the `SHADOWBRAIN_POLICY__…` environment overrides) and prints the result —
//! its name, content hash and every setting resolved, as TOML (a complete policy file that
//! compiles to the same hash) or as the JSON of `GET /v1/policy` — or every error found,
//! each with its key and how to fix it, and a non-zero exit.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Subcommand;
use serde_json::Value;
use shadowbrain_runtime::policy::Policy;

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
                })?
            } else {
                format!(
                    "# {} compiles: policy `{}`, hash {}.\n# Every setting, defaults filled \
                     in (this text compiles to the same hash):\n{}",
                    file.display(),
                    policy.name,
                    policy.hash,
                    toml_text(&compiled)
                )
            };
            super::out(text.trim_end())
        }
    }
}

/// A JSON object as TOML: top-level scalars first, then one `[table]` per object and one
/// `[[table.array]]` per element of an array of objects. Enough for a compiled policy
/// (scalars, arrays of scalars, nested tables, arrays of tables); TOML has no null, so a
/// null setting is left out, which is what "unset" means in a policy file.
fn toml_text(value: &Value) -> String {
    let mut out = String::new();
    if let Value::Object(map) = value {
        write_table(&mut out, "", map);
    }
    out
}

fn write_table(out: &mut String, path: &str, map: &serde_json::Map<String, Value>) {
    let is_table = |v: &Value| v.is_object();
    let is_table_array = |v: &Value| {
        v.as_array()
            .is_some_and(|a| !a.is_empty() && a.iter().all(Value::is_object))
    };
    for (key, v) in map {
        if v.is_null() || is_table(v) || is_table_array(v) {
            continue;
        }
        let _ = writeln!(out, "{} = {}", toml_key(key), toml_value(v));
    }
    for (key, v) in map {
        let child = if path.is_empty() {
            toml_key(key)
        } else {
            format!("{path}.{}", toml_key(key))
        };
        if let Value::Object(inner) = v {
            let _ = writeln!(out, "\n[{child}]");
            write_table(out, &child, inner);
        } else if is_table_array(v) {
            for item in v.as_array().into_iter().flatten() {
                if let Value::Object(inner) = item {
                    let _ = writeln!(out, "\n[[{child}]]");
                    write_table(out, &child, inner);
                }
            }
        }
    }
}

fn toml_key(key: &str) -> String {
    if !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        key.to_string()
    } else {
        toml_string(key)
    }
}

fn toml_value(v: &Value) -> String {
    match v {
        Value::String(s) => toml_string(s),
        Value::Array(items) => {
            let items: Vec<String> = items
                .iter()
                .filter(|i| !i.is_null())
                .map(toml_value)
                .collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("{} = {}", toml_key(k), toml_value(v)))
                .collect();
            format!("{{ {} }}", items.join(", "))
        }
        // Numbers and booleans are written the same way in both languages (JSON has no
        // NaN or infinity to worry about).
        other => other.to_string(),
    }
}

/// A TOML basic string; JSON's escapes are valid TOML escapes.
fn toml_string(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}
