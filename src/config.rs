//! The server's config file (`--config`, TOML; docs/configuration.md), read with `config` so every
//! key can be overridden from the environment as `SHADOWBRAIN__SECTION__KEY` (e.g.
//! `SHADOWBRAIN__LIMITS__MAX_K=50`). Eight sections, each optional:
//!
//! - `[provider]`: `base_url`, `api_key_env` and `timeout` shared by `[embedder]` and
//!   `[llm]` when their kind is `openai` and they do not set their own — so one section
//!   points both at a local Ollama.
//! - `[embedder]`: the embedder (default `auto`: the local model when installed, else
//!   `hash`; both in-process).
//! - `[llm]`: the judge and condenser endpoint (default `none`: rules and extractive).
//! - `[[auth.keys]]`: API keys (their hex SHA-256) and the namespace each sees.
//! - `[limits]`: request limits (defaults: 8 MiB bodies, 1000 events per call, 1 MiB
//!   text, 256 KiB content, k ≤ 200, token_budget ≤ 32768).
//! - `[server]`: how connections are held (defaults: 30 s to send headers, also the idle
//!   keep-alive timeout; 30 s between body chunks; 30 s to answer; a 10 s drain; 1024
//!   connections; admission limits per route class; the edge thread at normal priority,
//!   `edge_realtime` to raise it), see [`crate::http`].
//!
//! - `[[namespaces]]`: a policy file of its own for a namespace (`name`, `policy`; a
//!   relative path is read from the config file's directory), so tenants never share a
//!   forgetting policy by accident.
//! - `[cluster]`: the NATS servers (and how to reach them: TLS and this node's credential,
//!   or `insecure_loopback`), node name, partitions and lease TTL of `serve --cluster` (see
//!   `crate::cluster`); ignored by plain `serve`.
//!
//! Every mistake is refused at start-up with what to fix — an unknown section or key, a
//! value out of range — rather than discovered on the first request.

use std::path::{Path, PathBuf};

use crate::Limits;
use crate::embed::EmbedderConfig;
use crate::llm::LlmConfig;
use anyhow::Context;
use serde::Deserialize;

use crate::auth::{ApiKey, Auth};
use crate::http::{ServerConfig, ServerLimits};

/// The sections a config file may have.
const SECTIONS: [&str; 8] = [
    "cluster",
    "provider",
    "embedder",
    "llm",
    "auth",
    "limits",
    "server",
    "namespaces",
];

/// One `[[namespaces]]` entry: a namespace with a policy file of its own.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespacePolicy {
    /// The namespace (as an API key's `namespace` names it).
    pub name: String,
    /// Its policy file; relative paths are read from the config file's directory.
    pub policy: PathBuf,
}

/// The `[provider]` section: connection settings `[embedder]` and `[llm]` inherit.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderConfig {
    /// The API root, e.g. `http://127.0.0.1:11434/v1`.
    #[serde(rename = "base_url")]
    _base_url: Option<String>,
    /// The environment variable holding the API key.
    #[serde(rename = "api_key_env")]
    _api_key_env: Option<String>,
    /// Per-request timeout (`"30s"`).
    #[serde(rename = "timeout")]
    _timeout: Option<String>,
}

/// A whole config file, checked.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    /// `[embedder]`.
    pub embedder: EmbedderConfig,
    /// `[llm]`.
    pub llm: LlmConfig,
    /// `[[auth.keys]]`.
    pub auth: Auth,
    /// `[limits]`.
    pub limits: Limits,
    /// `[server]`, checked.
    pub server: ServerLimits,
    /// `[[namespaces]]`, names checked and paths resolved (the files are read when the
    /// runtime is configured).
    pub namespaces: Vec<NamespacePolicy>,
    /// `[cluster]`, read by `serve --cluster` only (unchecked until then).
    #[cfg(feature = "cluster")]
    pub cluster: crate::cluster::ClusterConfig,
}

impl ConfigFile {
    /// Reads `path` (none: defaults) with `SHADOWBRAIN__SECTION__KEY` overrides.
    pub fn load(path: Option<&Path>) -> anyhow::Result<ConfigFile> {
        let mut builder = config::Config::builder();
        if let Some(p) = path {
            if !p.is_file() {
                anyhow::bail!(
                    "the config file {} does not exist; check the path given to --config",
                    p.display()
                );
            }
            builder = builder.add_source(config::File::from(p).format(config::FileFormat::Toml));
        }
        let cfg = builder
            .add_source(
                config::Environment::with_prefix("SHADOWBRAIN")
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true),
            )
            .build()
            .with_context(|| match path {
                Some(p) => format!("reading the config file {}", p.display()),
                None => "reading SHADOWBRAIN__* settings".to_string(),
            })?;
        let top: std::collections::HashMap<String, config::Value> =
            cfg.clone()
                .try_deserialize()
                .context("the config file must be TOML sections such as [embedder]")?;
        let mut unknown: Vec<&String> = top
            .keys()
            .filter(|k| !SECTIONS.contains(&k.as_str()))
            .collect();
        if !unknown.is_empty() {
            unknown.sort();
            anyhow::bail!(
                "unknown config section(s) {unknown:?}; the sections are [provider], \
                 [embedder], [llm], [[auth.keys]], [limits], [server], [[namespaces]] and \
                 [cluster] (see docs/configuration.md)"
            );
        }
        // Checked for unknown keys, then merged as written into the sections that use it.
        section::<ProviderConfig>(&cfg, "provider")?;
        let provider = cfg.get_table("provider").unwrap_or_default();
        let embedder =
            inheriting::<EmbedderConfig>(&cfg, "embedder", &provider)?.unwrap_or_default();
        let llm = inheriting::<LlmConfig>(&cfg, "llm", &provider)?.unwrap_or_default();
        llm.validate()?;
        let auth = match section::<Vec<ApiKey>>(&cfg, "auth.keys")? {
            Some(keys) => Auth::with_keys(&keys)?,
            None => Auth::open(),
        };
        let limits = section::<Limits>(&cfg, "limits")?.unwrap_or_default();
        let problems = limits.problems();
        if !problems.is_empty() {
            anyhow::bail!("the [limits] section is invalid: {}", problems.join("; "));
        }
        let server = section::<ServerConfig>(&cfg, "server")?
            .unwrap_or_default()
            .limits()
            .map_err(|problems| {
                anyhow::anyhow!("the [server] section is invalid: {}", problems.join("; "))
            })?;
        let base = path.and_then(Path::parent).unwrap_or(Path::new("."));
        let namespaces = namespaces(section(&cfg, "namespaces")?.unwrap_or_default(), base)?;
        #[cfg(feature = "cluster")]
        let cluster = section(&cfg, "cluster")?.unwrap_or_default();
        Ok(ConfigFile {
            #[cfg(feature = "cluster")]
            cluster,
            embedder,
            llm,
            auth,
            limits,
            server,
            namespaces,
        })
    }
}

/// The `[[namespaces]]` entries checked (valid, distinct names), their paths resolved
/// against `base`.
fn namespaces(entries: Vec<NamespacePolicy>, base: &Path) -> anyhow::Result<Vec<NamespacePolicy>> {
    let mut seen = std::collections::BTreeSet::new();
    entries
        .into_iter()
        .map(|mut entry| {
            crate::validate_id("namespace", &entry.name)
                .map_err(|e| anyhow::anyhow!("a [[namespaces]] entry is invalid: {e}"))?;
            if !seen.insert(entry.name.clone()) {
                anyhow::bail!(
                    "[[namespaces]] names {:?} twice; give each namespace one entry",
                    entry.name
                );
            }
            if entry.policy.is_relative() {
                entry.policy = base.join(&entry.policy);
            }
            Ok(entry)
        })
        .collect()
}

/// Like [`section`], with the `[provider]` keys the section does not set filled in when
/// its kind is `openai` (a `hash` embedder has no endpoint to inherit).
fn inheriting<T: serde::de::DeserializeOwned>(
    cfg: &config::Config,
    key: &str,
    provider: &config::Map<String, config::Value>,
) -> anyhow::Result<Option<T>> {
    let mut table = match cfg.get_table(key) {
        Ok(table) => table,
        Err(config::ConfigError::NotFound(_)) => return Ok(None),
        Err(e) => return Err(anyhow::anyhow!("the [{key}] section is invalid: {e}")),
    };
    let openai = table
        .get("kind")
        .and_then(|k| k.clone().into_string().ok())
        .is_some_and(|k| k == "openai");
    if openai {
        for (k, v) in provider {
            table.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    config::Value::new(None, config::ValueKind::Table(table))
        .try_deserialize::<T>()
        .map(Some)
        .map_err(|e| anyhow::anyhow!("the [{key}] section is invalid: {e}"))
}

/// One section, `None` when absent, or an error naming the section and the mistake.
fn section<T: serde::de::DeserializeOwned>(
    cfg: &config::Config,
    key: &str,
) -> anyhow::Result<Option<T>> {
    match cfg.get::<T>(key) {
        Ok(v) => Ok(Some(v)),
        Err(config::ConfigError::NotFound(_)) => Ok(None),
        Err(e) if key == "namespaces" => Err(anyhow::anyhow!(
            "the [[namespaces]] entries are invalid: {e}; each needs `name` (the namespace) \
             and `policy` (its policy file)"
        )),
        Err(e) if key == "auth.keys" => Err(anyhow::anyhow!(
            "the [[auth.keys]] entries are invalid: {e}; each needs `sha256` (hex SHA-256 of \
             the key) and `namespace`"
        )),
        Err(e) => Err(anyhow::anyhow!("the [{key}] section is invalid: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> anyhow::Result<ConfigFile> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shadowbrain.toml");
        std::fs::write(&path, text).unwrap();
        ConfigFile::load(Some(&path))
    }

    #[test]
    fn an_absent_file_section_is_the_default() {
        let c = load("").unwrap();
        assert_eq!(c.limits, Limits::default());
        assert!(!c.auth.required());
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn the_cluster_section_is_read_and_checked() {
        let c = load(
            "[cluster]\nurls = [\"nats://127.0.0.1:4222\"]\nnode = \"n1\"\npartitions = 32\n\
             lease_ttl = \"5s\"\ninsecure_loopback = true\n",
        )
        .unwrap();
        let cluster = c.cluster.check().unwrap();
        assert!(cluster.insecure_loopback && cluster.tls.is_none());
        assert_eq!(cluster.partitions, 32);
        assert_eq!(cluster.node, "n1");
        assert_eq!(cluster.lease_ttl, std::time::Duration::from_secs(5));
        let e = load("[cluster]\nleases = 3\n").unwrap_err();
        assert!(format!("{e:#}").contains("leases"), "{e:#}");
        let e = load("[cluster]\nreplicas = 7\n")
            .unwrap()
            .cluster
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("replicas is 7"), "{e}");
    }

    #[test]
    fn every_section_is_read() {
        let c = load(
            r#"
[embedder]
kind = "hash"
dimensions = 128

[llm]
kind = "openai"
base_url = "http://127.0.0.1:11434/v1"
model = "qwen2.5:7b-instruct"
timeout = "10s"

[[auth.keys]]
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
namespace = "acme"

[limits]
max_k = 50
text_bytes = 1024
"#,
        )
        .unwrap();
        assert_eq!(c.embedder.dimensions, Some(128));
        assert_eq!(c.llm.model.as_deref(), Some("qwen2.5:7b-instruct"));
        assert!(c.auth.required());
        assert_eq!(c.limits.max_k, 50);
        assert_eq!(c.limits.max_text_bytes, 1024);
        assert_eq!(
            c.limits.max_body_bytes,
            8 << 20,
            "unset keys keep their default"
        );
    }

    #[test]
    fn provider_settings_serve_both_openai_sections_unless_they_set_their_own() {
        let c = load(
            r#"
[provider]
base_url = "http://127.0.0.1:11434/v1"
api_key_env = "OLLAMA_KEY"
timeout = "2m"

[embedder]
kind = "openai"
model = "nomic-embed-text"
dimensions = 768

[llm]
kind = "openai"
model = "qwen2.5:7b-instruct"
timeout = "20s"
"#,
        )
        .unwrap();
        assert_eq!(
            c.embedder.base_url.as_deref(),
            Some("http://127.0.0.1:11434/v1")
        );
        assert_eq!(c.llm.base_url.as_deref(), Some("http://127.0.0.1:11434/v1"));
        assert_eq!(c.embedder.api_key_env, "OLLAMA_KEY");
        assert_eq!(c.llm.api_key_env, "OLLAMA_KEY");
        assert_eq!(c.embedder.timeout, "2m");
        assert_eq!(c.llm.timeout, "20s", "a section's own key wins");
        // A hash embedder inherits nothing (it would refuse a base_url).
        let c = load(
            "[provider]
base_url = \"http://127.0.0.1:1/v1\"
[embedder]
kind = \"hash\"
",
        )
        .unwrap();
        assert_eq!(c.embedder.base_url, None);
        let typo = load(
            "[provider]
base_ulr = \"x\"
",
        )
        .unwrap_err()
        .to_string();
        assert!(
            typo.contains("provider") && typo.contains("base_ulr"),
            "{typo}"
        );
    }

    #[test]
    fn mistakes_are_named() {
        let typo = load("[limit]\nmax_k = 5\n").unwrap_err().to_string();
        assert!(
            typo.contains("limit") && typo.contains("[limits]"),
            "{typo}"
        );
        let key = load("[limits]\nmax_kk = 5\n").unwrap_err().to_string();
        assert!(key.contains("max_kk"), "{key}");
        let range = load("[limits]\nmax_k = 500\nevents_per_call = 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            range.contains("max_k = 500") && range.contains("events_per_call"),
            "{range}"
        );
        let llm = load("[llm]\nkind = \"openai\"\n").unwrap_err().to_string();
        assert!(llm.contains("base_url") && llm.contains("model"), "{llm}");
        let missing = ConfigFile::load(Some(Path::new("/nonexistent/shadowbrain.toml")))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("does not exist"), "{missing}");
    }
}
