//! The run configuration: one JSON document (`config.json` in every run directory), readable
//! from `--config FILE` and overridden by command-line flags. Every field has a default, so a
//! file needs only the keys it changes.

use std::path::Path;

use relation_model::{LinearRelationMode, RelationLmConfig};
use serde::{Deserialize, Serialize};

use crate::precision::Precision;
use crate::{Result, TrainError, error::io};

mod data;

pub use data::{DataSpec, MIN_UNITS, Packing, SplitMode};

/// Everything a training run needs, saved as `config.json` in the run directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// The model.
    pub model: ModelSpec,
    /// Corpus, split and tokenizer.
    pub data: DataSpec,
    /// Optimisation, schedule, evaluation and checkpoint cadence.
    pub train: TrainSpec,
    /// Device name (`flex`, `wgpu`, `cuda:0`, …).
    pub device: String,
    /// Data parallel: several devices, each running a share of every step's micro-batches on
    /// its own copy of the model; replaces `device` when not empty (the first one holds the
    /// optimizer and runs evaluation).
    pub devices: Vec<String>,
    /// How data parallel sums the replicas' gradients (`"auto"`, `"collective"` or
    /// `"ordered"`; see [`Reduce`]). Ignored on one device.
    pub reduce: Reduce,
}

/// How data parallel (`devices`) sums the gradients of a step's micro-batches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Reduce {
    /// Burn's collective where the devices have one (`collective`), the ordered sum elsewhere.
    #[default]
    Auto,
    /// Burn's collective engine (`burn::tensor::distributed::all_reduce`, a `Sum`): each
    /// replica sums its own micro-batches, then one all-reduce per parameter sums the
    /// replicas, device to device. Burn 0.22 runs it on CUDA devices with NCCL; on other
    /// devices the run refuses to start and says why. Equal to one device up to the order of
    /// the sum: with two devices and one micro-batch each, the all-reduce is one addition per
    /// element, the one a single device does.
    Collective,
    /// Every micro-batch's gradient comes back to the first device and is added there in
    /// micro-batch order, as one device adds them: bit for bit the single-device run, on any
    /// devices, including different backends.
    Ordered,
}

impl std::fmt::Display for Reduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Collective => "collective",
            Self::Ordered => "ordered",
        })
    }
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            model: ModelSpec::default(),
            data: DataSpec::default(),
            train: TrainSpec::default(),
            device: "flex".into(),
            devices: Vec::new(),
            reduce: Reduce::Auto,
        }
    }
}

/// A model preset with optional overrides; the vocabulary size comes from the tokenizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSpec {
    /// A `relation_model` preset ([`RelationLmConfig::PRESETS`]: `cpu`, the default, a model
    /// that trains in minutes on two CPU cores; `tiny`, `small`, `10m`, `30m`, `100m`,
    /// `hybrid-32m`), with `-mha` for the attention baseline.
    pub preset: String,
    /// Layer pattern override (`F` Full Relation, `L` Linear Relation, `A` attention, …;
    /// `LLLF` is the paper's Hybrid).
    pub pattern: Option<String>,
    /// Width override.
    pub d_model: Option<usize>,
    /// Depth override.
    pub n_layers: Option<usize>,
    /// Head-count override.
    pub n_heads: Option<usize>,
    /// FFN width override.
    pub d_ff: Option<usize>,
    /// Self temperature `tau_S` override (default 2).
    pub tau: Option<f64>,
    /// Initial count-calibration `lambda` override (default 0.5).
    pub lambda_init: Option<f64>,
    /// `false` freezes `lambda` at `lambda_init` (with `lambda_init = 0`: no count calibration).
    pub lambda_trainable: Option<bool>,
    /// `false` turns Givens head mixing off (and allows an odd head count, e.g. one head).
    pub givens: Option<bool>,
    /// How the Linear Relation layers run (`"recurrent"`, the default, or
    /// `{"chunked": {"chunk_size": N}}`; on the command line `--linear-mode chunked:N`). The
    /// same function either way: it changes speed and rounding, never the parameters.
    pub linear_mode: Option<LinearRelationMode>,
    /// `false` is the `I = X` ablation of the Full Relation layers (no `W_I`).
    pub info_projection: Option<bool>,
    /// `true` is the Exchange-only ablation of the Full Relation layers (no Self term).
    pub exchange_only: Option<bool>,
}

impl Default for ModelSpec {
    fn default() -> Self {
        Self {
            preset: "cpu".into(),
            pattern: None,
            d_model: None,
            n_layers: None,
            n_heads: None,
            d_ff: None,
            tau: None,
            lambda_init: None,
            lambda_trainable: None,
            givens: None,
            linear_mode: None,
            info_projection: None,
            exchange_only: None,
        }
    }
}

impl ModelSpec {
    /// The model configuration for a tokenizer of `vocab_size` tokens.
    ///
    /// # Errors
    /// An unknown preset, or a configuration the model refuses (e.g. odd heads).
    pub fn resolve(&self, vocab_size: usize) -> Result<RelationLmConfig> {
        let base = RelationLmConfig::preset(&self.preset).ok_or_else(|| TrainError::Invalid {
            name: "model.preset",
            value: self.preset.clone(),
            rule: format!(
                "unknown preset; choose {} (append -mha for the attention baseline)",
                RelationLmConfig::PRESETS.join(", ")
            ),
        })?;
        let mut config = base;
        config.vocab_size = vocab_size;
        if let Some(p) = &self.pattern {
            config.pattern = p.clone();
        }
        if let Some(v) = self.d_model {
            config.d_model = v;
        }
        if let Some(v) = self.n_layers {
            config.n_layers = v;
        }
        if let Some(v) = self.n_heads {
            config.n_heads = v;
        }
        if let Some(v) = self.d_ff {
            config.d_ff = v;
        }
        if let Some(v) = self.tau {
            config.tau = v;
        }
        if let Some(v) = self.lambda_init {
            config.lambda_init = v;
        }
        if let Some(v) = self.lambda_trainable {
            config.lambda_trainable = v;
        }
        if let Some(v) = self.givens {
            config.givens = v;
        }
        if let Some(v) = self.linear_mode {
            config.linear_mode = v;
        }
        if let Some(v) = self.info_projection {
            config.info_projection = v;
        }
        if let Some(v) = self.exchange_only {
            config.exchange_only = v;
        }
        config.validate()?;
        Ok(config)
    }
}

/// Optimisation and cadence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSpec {
    /// Optimizer steps of the whole run (the schedule is laid out over them).
    pub steps: u64,
    /// Tokens per training sequence (context length).
    pub seq_len: usize,
    /// Sequences per forward/backward pass (micro-batch).
    pub batch_size: usize,
    /// Tokens per optimizer step: gradients of `tokens_per_step / (batch_size * seq_len)`
    /// micro-batches are accumulated before each step. A whole number of micro-batches
    /// (`validate` refuses anything else).
    pub tokens_per_step: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Learning rate at the end of the decay, as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// Linear warm-up steps (default: 10% of `steps`).
    pub warmup_steps: Option<u64>,
    /// Share of the steps spent in the final linear decay (0.2 = the paper's WSD80).
    pub decay_fraction: f64,
    /// AdamW decoupled weight decay (matrices and embeddings; not norms, lambda or angles).
    pub weight_decay: f64,
    /// AdamW beta1.
    pub beta1: f64,
    /// AdamW beta2.
    pub beta2: f64,
    /// AdamW epsilon.
    pub epsilon: f64,
    /// Clip the global gradient norm to this value (0 = no clipping).
    pub grad_clip: f64,
    /// Seed of the initial weights and the data order.
    pub seed: u64,
    /// Evaluate on the validation split every N steps (and at the end).
    pub eval_every: u64,
    /// Validation tokens per evaluation (0 = the whole validation split).
    pub eval_tokens: usize,
    /// Write a checkpoint every N steps (and at the end).
    pub checkpoint_every: u64,
    /// Checkpoints kept on disk (the newest ones).
    pub keep_checkpoints: usize,
    /// Print a progress line every N steps.
    pub log_every: u64,
    /// Tokens sampled after training (0 = none).
    pub sample_tokens: usize,
    /// The dtype of the forward and backward passes: `f32`, or `f16` / `bf16` with f32 master
    /// weights (and dynamic loss scaling for f16); see [`crate::precision`].
    pub precision: Precision,
    /// Activation checkpointing per block (`relation_model::activation_checkpointing`): the forward pass
    /// keeps only each block's input, the backward pass recomputes one block at a time, and the
    /// tied head and the loss run over chunks of tokens, so no `[T, V]` logits exist. Memory
    /// for long sequences falls from every block's activations to one block's; the price is
    /// one more forward pass. Not for patterns with RealFormer (`R`) layers.
    pub activation_checkpointing: bool,
}

impl Default for TrainSpec {
    fn default() -> Self {
        Self {
            steps: 250,
            seq_len: 128,
            batch_size: 16,
            tokens_per_step: 2048,
            lr: 3e-3,
            min_lr_ratio: 0.0,
            warmup_steps: None,
            decay_fraction: 0.2,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            epsilon: 1e-8,
            grad_clip: 1.0,
            seed: 42,
            eval_every: 50,
            eval_tokens: 16_384,
            checkpoint_every: 50,
            keep_checkpoints: 2,
            log_every: 10,
            sample_tokens: 120,
            precision: Precision::F32,
            activation_checkpointing: false,
        }
    }
}

impl TrainSpec {
    /// Warm-up steps: the configured number, else 10% of the steps.
    pub fn warmup(&self) -> u64 {
        self.warmup_steps.unwrap_or(self.steps / 10)
    }

    /// Tokens in one micro-batch (one forward/backward pass): `batch_size * seq_len`.
    pub fn micro_batch_tokens(&self) -> usize {
        self.batch_size.saturating_mul(self.seq_len)
    }

    /// Micro-batches accumulated per optimizer step (`tokens_per_step` over a micro-batch's
    /// tokens; a `tokens_per_step` that [`RunConfig::validate`] accepts divides exactly).
    pub fn accumulation(&self) -> usize {
        self.tokens_per_step
            .div_ceil(self.micro_batch_tokens().max(1))
            .max(1)
    }

    /// Tokens per optimizer step actually used: a whole number of micro-batches, which is
    /// `tokens_per_step` itself once the configuration validates.
    pub fn effective_tokens_per_step(&self) -> usize {
        self.accumulation() * self.batch_size * self.seq_len
    }
}

fn invalid(name: &'static str, value: impl ToString, rule: &str) -> TrainError {
    TrainError::Invalid {
        name,
        value: value.to_string(),
        rule: rule.into(),
    }
}

impl RunConfig {
    /// The devices training runs on: `devices`, else `[device]`.
    pub fn device_names(&self) -> Vec<String> {
        if self.devices.is_empty() {
            vec![self.device.clone()]
        } else {
            self.devices.clone()
        }
    }

    /// Reads a (possibly partial) configuration file.
    ///
    /// # Errors
    /// [`TrainError::Config`] naming the file and the parser's message (unknown keys included).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(io(path))?;
        serde_json::from_str(&text).map_err(|e| TrainError::Config {
            path: path.into(),
            reason: e.to_string(),
        })
    }

    /// Reads a (possibly partial) configuration file over `base`: only the keys the file names
    /// change (objects merge key by key), so a file of three keys on top of a run's saved
    /// configuration changes those three.
    ///
    /// # Errors
    /// [`TrainError::Config`] naming the file and the parser's message (unknown keys included).
    pub fn load_onto(base: &Self, path: &Path) -> Result<Self> {
        let bad = |reason: String| TrainError::Config {
            path: path.into(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(io(path))?;
        let patch: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let mut merged = serde_json::to_value(base).expect("config serializes");
        merge(&mut merged, patch);
        serde_json::from_value(merged).map_err(|e| bad(e.to_string()))
    }

    /// What differs from `saved` (the configuration a run was started with) and whether a
    /// resume may change it: the devices and the evaluation, logging and checkpoint cadence
    /// change freely; [`RESUMABLE_CHANGES`] change with a [`Change`] recorded, as they end the
    /// run's bit-exact reproducibility; anything else defines the run (model, data, batch
    /// shape, seed, optimizer betas) and is refused.
    ///
    /// # Errors
    /// [`TrainError::Invalid`] naming every refused key with both values.
    pub fn changes_since(&self, saved: &Self) -> Result<Vec<Change>> {
        let mut before = Vec::new();
        let mut after = Vec::new();
        flatten(
            "",
            &serde_json::to_value(saved).expect("config serializes"),
            &mut before,
        );
        flatten(
            "",
            &serde_json::to_value(self).expect("config serializes"),
            &mut after,
        );
        let mut changes = Vec::new();
        let mut refused = Vec::new();
        for ((key, from), (_, to)) in before.into_iter().zip(after) {
            if from == to || FREE_CHANGES.contains(&key.as_str()) {
                continue;
            }
            if RESUMABLE_CHANGES.contains(&key.as_str()) {
                changes.push(Change { key, from, to });
            } else {
                refused.push(format!("{key} {from} -> {to}"));
            }
        }
        if !refused.is_empty() {
            return Err(TrainError::Invalid {
                name: "--resume",
                value: refused.join(", "),
                rule: format!(
                    "these settings define the run and cannot change on resume (only {} can, and the devices and cadence); start a new run instead (another --run-dir, or --overwrite)",
                    RESUMABLE_CHANGES.join(", ")
                ),
            });
        }
        Ok(changes)
    }

    /// Checks every range rule that does not need the data.
    ///
    /// # Errors
    /// [`TrainError::Invalid`] for the first setting out of range.
    pub fn validate(&self) -> Result<()> {
        let t = &self.train;
        let d = &self.data;
        if t.steps == 0 {
            return Err(invalid("train.steps", t.steps, "must be >= 1"));
        }
        if t.seq_len == 0 {
            return Err(invalid("train.seq_len", t.seq_len, "must be >= 1"));
        }
        if t.batch_size == 0 {
            return Err(invalid("train.batch_size", t.batch_size, "must be >= 1"));
        }
        let micro_batch = t.micro_batch_tokens();
        if t.tokens_per_step == 0 || !t.tokens_per_step.is_multiple_of(micro_batch) {
            let below = t.tokens_per_step / micro_batch * micro_batch;
            let above = below.saturating_add(micro_batch);
            let nearest = if below == 0 {
                format!("{above}")
            } else {
                format!("{below} or {above}")
            };
            return Err(invalid(
                "train.tokens_per_step",
                t.tokens_per_step,
                &format!(
                    "must be a whole number of micro-batches of train.batch_size x train.seq_len = {} x {} = {micro_batch} tokens (e.g. {nearest}); set --tokens-per-step to a multiple of {micro_batch}, or change --batch-size / --seq-len",
                    t.batch_size, t.seq_len
                ),
            ));
        }
        if !(t.lr.is_finite() && t.lr > 0.0) {
            return Err(invalid("train.lr", t.lr, "must be a positive number"));
        }
        if !(0.0..=1.0).contains(&t.min_lr_ratio) {
            return Err(invalid(
                "train.min_lr_ratio",
                t.min_lr_ratio,
                "must be in [0, 1]",
            ));
        }
        if !(0.0..=1.0).contains(&t.decay_fraction) {
            return Err(invalid(
                "train.decay_fraction",
                t.decay_fraction,
                "must be in [0, 1]",
            ));
        }
        if t.warmup() > t.steps {
            return Err(invalid(
                "train.warmup_steps",
                t.warmup(),
                &format!("must be <= train.steps = {}", t.steps),
            ));
        }
        for (name, value) in [("train.beta1", t.beta1), ("train.beta2", t.beta2)] {
            if !(0.0..1.0).contains(&value) {
                return Err(invalid(name, value, "must be in [0, 1)"));
            }
        }
        if !(t.weight_decay >= 0.0 && t.weight_decay.is_finite()) {
            return Err(invalid(
                "train.weight_decay",
                t.weight_decay,
                "must be >= 0",
            ));
        }
        if !(t.epsilon > 0.0 && t.epsilon.is_finite()) {
            return Err(invalid("train.epsilon", t.epsilon, "must be > 0"));
        }
        if !(t.grad_clip >= 0.0 && t.grad_clip.is_finite()) {
            return Err(invalid(
                "train.grad_clip",
                t.grad_clip,
                "must be >= 0 (0 = off)",
            ));
        }
        for (name, value) in [
            ("train.eval_every", t.eval_every),
            ("train.checkpoint_every", t.checkpoint_every),
            ("train.log_every", t.log_every),
        ] {
            if value == 0 {
                return Err(invalid(name, value, "must be >= 1"));
            }
        }
        if t.keep_checkpoints == 0 {
            return Err(invalid("train.keep_checkpoints", 0, "must be >= 1"));
        }
        if !(d.val_fraction > 0.0 && d.val_fraction < 0.5) {
            return Err(invalid(
                "data.val_fraction",
                d.val_fraction,
                "must be in (0, 0.5)",
            ));
        }
        if d.tokenizer.is_none() && !(256..=1 << 20).contains(&d.vocab_size) {
            return Err(invalid(
                "data.vocab_size",
                d.vocab_size,
                "must be in [256, 1048576] (byte-level BPE starts from 256 byte tokens)",
            ));
        }
        Ok(())
    }
}

/// Settings a resume may change freely: where the run computes and how often it evaluates,
/// logs and saves (none of them changes the weights).
pub const FREE_CHANGES: &[&str] = &[
    "device",
    "devices",
    "reduce",
    "data.cache_dir",
    "train.eval_every",
    "train.eval_tokens",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.log_every",
    "train.sample_tokens",
    "train.activation_checkpointing",
];

/// Settings a resume may change to recover a run (a lower learning rate after a divergence,
/// more steps, another schedule or clip): recorded in the run's `changes.jsonl`, and from that
/// step on the run is no longer reproducible from its original configuration alone.
pub const RESUMABLE_CHANGES: &[&str] = &[
    "train.steps",
    "train.lr",
    "train.min_lr_ratio",
    "train.warmup_steps",
    "train.decay_fraction",
    "train.weight_decay",
    "train.grad_clip",
    "train.precision",
    "model.linear_mode",
];

/// One setting changed on resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// Dotted key (`train.lr`).
    pub key: String,
    /// The value before.
    pub from: serde_json::Value,
    /// The value from now on.
    pub to: serde_json::Value,
}

/// Merges `patch` into `base`: objects key by key, anything else replaced.
fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Dotted key → value for every leaf (arrays are leaves), in serialization order.
fn flatten(prefix: &str, value: &serde_json::Value, out: &mut Vec<(String, serde_json::Value)>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        leaf => out.push((prefix.to_string(), leaf.clone())),
    }
}
