//! Setup: the checks that need no files, the devices, the locked run directory, the data, the
//! run's identity files and the initial model; and the banner that describes the run.

use std::fs;
use std::path::Path;

use burn::module::Module;
use burn::tensor::Device;
use relation_kernels::device::parse_device;
use relation_model::{RelationLm, RelationLmConfig};
use tokenizers::Tokenizer;

use super::TrainOptions;
use super::collective::Reduction;
use super::run_dir::{Start, open_run};
use super::share;
use crate::config::{Packing, RunConfig, TrainSpec};
use crate::data::{self, Corpus};
use crate::error::io;
use crate::fs::{RunLock, write_atomic};
use crate::precision::Precision;
use crate::{Result, TrainError};

/// What a run is, fixed before its first step: the settings, the devices, the data and the
/// model configuration, with the run directory held locked for as long as this lives.
pub(super) struct Run<'a> {
    /// How `train` was asked to run.
    pub(super) opts: &'a TrainOptions,
    /// The whole configuration (recorded again when a resume changes it).
    pub(super) config: RunConfig,
    /// `config.train`.
    pub(super) t: TrainSpec,
    /// The device names, as given.
    pub(super) device_names: Vec<String>,
    /// Those devices, with autodiff; the first holds the optimizer.
    pub(super) replicas: Vec<Device>,
    /// How a data-parallel step sums its gradients across `replicas` (holding Burn's
    /// distributed context for the run when that is the collective).
    pub(super) reduction: Reduction,
    /// Whether this invocation continues from a checkpoint.
    pub(super) resume: bool,
    /// The step this invocation stops after (`--stop-at`; rank 0's on every rank).
    pub(super) stop_at: Option<u64>,
    /// The tokenized corpus.
    pub(super) corpus: Corpus,
    /// Its tokenizer.
    pub(super) tokenizer: Tokenizer,
    /// `Some(<|endoftext|>'s id)` when rows are packed documents (the token segments start
    /// at), `None` for windows.
    pub(super) document_marker: Option<u32>,
    /// The resolved model configuration.
    pub(super) model_config: RelationLmConfig,
    /// It as `model.json` holds it (checkpoints carry its fingerprint).
    pub(super) model_json: String,
    /// The run directory's lock (rank 0's; the other ranks of a multi-process run hold none).
    _lock: Option<RunLock>,
}

impl<'a> Run<'a> {
    /// Checks the settings, opens the devices, locks and opens the run directory, prepares the
    /// data, and writes the run's identity files (or, on resume, checks them); says what it
    /// decided (a run discarded, data tokenized or reused) through `log`.
    ///
    /// # Errors
    /// Bad settings, data or device; a run that exists without `resume` or `overwrite`; a run
    /// directory in use; on resume, data or settings that no longer give the run's identity.
    pub(super) fn setup(
        mut config: RunConfig,
        opts: &'a TrainOptions,
        log: &mut dyn FnMut(String),
    ) -> Result<(Self, Start)> {
        config.validate()?;
        if let Some(stop) = opts.stop_at
            && stop == 0
        {
            return Err(TrainError::Invalid {
                name: "--stop-at",
                value: "0".into(),
                rule: "must be >= 1".into(),
            });
        }
        if let (Some(name), false) = (&opts.from_checkpoint, opts.resume) {
            return Err(TrainError::Invalid {
                name: "--from-checkpoint",
                value: name.clone(),
                rule: "only resumes (it needs --resume)".into(),
            });
        }
        let ranks = &*opts.ranks;
        if !ranks.is_root() {
            return Self::follow(opts);
        }
        let accumulation = config.train.accumulation();
        if ranks.size() > accumulation {
            return Err(TrainError::Invalid {
                name: "--tokens-per-step",
                value: config.train.effective_tokens_per_step().to_string(),
                rule: format!(
                    "gives {accumulation} micro-batch(es) of --batch-size x --seq-len per step; {n} MPI ranks need at least {n}, one each",
                    n = ranks.size()
                ),
            });
        }
        let (device_names, replicas, reduction) = open_devices(&config, opts)?;
        let t = config.train.clone();
        let lock = RunLock::acquire(&opts.run_dir)?;
        let start = open_run(&config, opts, log)?;
        let resume = matches!(start, Start::Resume(_));
        tracing::info!(
            run_dir = %opts.run_dir.display(),
            devices = %device_names.join(" + "),
            cpu_threads = relation_kernels::cpu_threads(),
            resume,
            "run start"
        );

        let corpus = data::prepare(&config.data, log)?;
        // `auto` becomes the layout the data calls for, and config.json records that one.
        let packing = config.data.packing.resolve(corpus.documents);
        if packing != config.data.packing {
            log(format!(
                "data: packing {} ({} document{}{})",
                packing.name(),
                corpus.documents,
                if corpus.documents == 1 { "" } else { "s" },
                match packing {
                    Packing::Documents => ": each row's documents are computed apart",
                    _ => ", cut into paragraph groups: each window is one sequence",
                }
            ));
            config.data.packing = packing;
        }
        let model_config = config.model.resolve(corpus.meta.vocab_size)?;
        let model_json = serde_json::to_string_pretty(&model_config).expect("config serializes");
        write_or_check_identity(&opts.run_dir, &config, resume, &corpus, &model_json)?;
        let tokenizer = corpus
            .tokenizer_json
            .parse::<Tokenizer>()
            .map_err(|e| TrainError::Tokenizer(e.to_string()))?;
        let document_marker = match packing {
            Packing::Documents => Some(tokenizer.token_to_id(data::EOT).ok_or_else(|| {
                TrainError::Tokenizer(format!(
                    "--packing documents needs the tokenizer's `{}` token, which it lacks",
                    data::EOT
                ))
            })?),
            _ => None,
        };
        if ranks.size() > 1 {
            share::send_start(ranks, &config, resume, opts.stop_at, &corpus);
        }
        let run = Self {
            opts,
            config,
            t,
            device_names,
            replicas,
            reduction,
            resume,
            stop_at: opts.stop_at,
            corpus,
            tokenizer,
            document_marker,
            model_config,
            model_json,
            _lock: Some(lock),
        };
        Ok((run, start))
    }

    /// A rank other than 0: the run as rank 0 set it up (its configuration, data and start),
    /// on this process's devices; the run directory is rank 0's alone.
    ///
    /// # Errors
    /// A start that does not decode, a device that does not open.
    fn follow(opts: &'a TrainOptions) -> Result<(Self, Start)> {
        let shared = share::receive_start(&opts.ranks)?;
        let config = shared.config;
        let (device_names, replicas, reduction) = open_devices(&config, opts)?;
        let corpus = shared.corpus;
        let model_config = config.model.resolve(corpus.meta.vocab_size)?;
        let model_json = serde_json::to_string_pretty(&model_config).expect("config serializes");
        let tokenizer = corpus
            .tokenizer_json
            .parse::<Tokenizer>()
            .map_err(|e| TrainError::Tokenizer(e.to_string()))?;
        let document_marker = match config.data.packing {
            Packing::Documents => tokenizer.token_to_id(data::EOT),
            _ => None,
        };
        let start = if shared.resume {
            Start::Resume(Vec::new())
        } else {
            Start::Fresh
        };
        let run = Self {
            opts,
            t: config.train.clone(),
            config,
            device_names,
            replicas,
            reduction,
            resume: shared.resume,
            stop_at: shared.stop_at,
            corpus,
            tokenizer,
            document_marker,
            model_config,
            model_json,
            _lock: None,
        };
        Ok((run, start))
    }

    /// The model at step 0 on the first device: the run's seed fixes its weights (a resume
    /// then loads the saved ones into it).
    ///
    /// # Errors
    /// A configuration the model refuses.
    pub(super) fn init_model(&self) -> Result<RelationLm> {
        let device = &self.replicas[0];
        device.seed(self.t.seed);
        Ok(self.model_config.init(device)?)
    }

    /// The run's one-line description through `log`: the model, its ablation switches, the
    /// devices and the step size (and how data parallel sums the gradients).
    pub(super) fn announce(&self, model: &RelationLm, log: &mut dyn FnMut(String)) {
        let c = &self.model_config;
        let t = &self.t;
        log(format!(
            "model: {} layers `{}`{}, d = {}, {} heads, {:.2}M parameters, {:.1} MFLOP per training token, vocab {} | device {} ({} CPU threads{}){} | {} x {} tokens x {} micro-batches = {} tokens per step, {} steps | rows: {}",
            c.n_layers,
            c.pattern,
            switches(c),
            c.d_model,
            c.n_heads,
            model.num_params() as f64 / 1e6,
            model.training_flops_per_token(t.seq_len) / 1e6,
            c.vocab_size,
            self.device_names.join(" + "),
            relation_kernels::cpu_threads(),
            // The vector instruction set of the Flex kernels, where they run.
            if self.replicas.iter().any(relation_kernels::is_flex) {
                format!(
                    ", Flex kernels in {}{}",
                    relation_kernels::flex_simd().name(),
                    flex_gemm()
                )
            } else {
                String::new()
            },
            match t.precision {
                Precision::F32 => String::new(),
                p => format!(", {} compute with f32 master weights", p.name()),
            },
            t.batch_size,
            t.seq_len,
            t.accumulation(),
            t.effective_tokens_per_step(),
            t.steps,
            self.config.data.packing.name()
        ));
        if let Some(how) = self.reduction.describe(&self.device_names) {
            log(format!("data parallel: {how}"));
        }
    }
}

/// The run directory's identity (model, tokenizer, data): written by a fresh start with the
/// configuration, compared by a resume, which refuses data or settings that changed.
///
/// # Errors
/// [`TrainError::RunDir`] naming the file that differs; I/O errors.
fn write_or_check_identity(
    run: &Path,
    config: &RunConfig,
    resume: bool,
    corpus: &Corpus,
    model_json: &str,
) -> Result<()> {
    // The corpus's identity: the tokenized corpus's cache key (a hash of every unit's text,
    // its side of the split and the tokenizer settings) and its sizes, so a resume notices
    // changed data even when the tokenizer is given rather than trained on it.
    let data_json = serde_json::to_string_pretty(&serde_json::json!({
        "corpus": corpus.cache.file_name().map(|n| n.to_string_lossy().into_owned()),
        "train_tokens": corpus.meta.train_tokens,
        "val_tokens": corpus.meta.val_tokens,
    }))
    .expect("json serializes");
    if !resume {
        let config_json = serde_json::to_string_pretty(config).expect("config serializes");
        write_atomic(&run.join("config.json"), config_json.as_bytes())?;
        write_atomic(&run.join("model.json"), model_json.as_bytes())?;
        write_atomic(&run.join("data.json"), data_json.as_bytes())?;
        return write_atomic(
            &run.join("tokenizer.json"),
            corpus.tokenizer_json.as_bytes(),
        );
    }
    for (name, now) in [
        ("model.json", model_json),
        ("tokenizer.json", corpus.tokenizer_json.as_str()),
        ("data.json", data_json.as_str()),
    ] {
        let path = run.join(name);
        if name == "data.json" && !path.exists() {
            continue; // a run started before data.json existed
        }
        let saved = fs::read_to_string(&path).map_err(io(&path))?;
        if saved != now {
            return Err(TrainError::RunDir {
                path: run.to_path_buf(),
                reason: format!(
                    "{name} differs from what this configuration and data produce now (data or settings changed since the run started); resume refused"
                ),
            });
        }
    }
    Ok(())
}

/// The run's devices (names as given, autodiff devices) and how a data-parallel step sums
/// their gradients.
///
/// # Errors
/// A device that does not open, a precision it lacks, a collective it cannot do.
fn open_devices(
    config: &RunConfig,
    opts: &TrainOptions,
) -> Result<(Vec<String>, Vec<Device>, Reduction)> {
    let device_names = config.device_names();
    let replicas = device_names
        .iter()
        .map(|name| open_device(name))
        .collect::<Result<Vec<Device>>>()?;
    config.train.precision.check(&replicas)?;
    let reduction = Reduction::open(
        config.reduce,
        &device_names,
        &replicas,
        opts.faults().host_all_reduce,
    )?;
    Ok((device_names, replicas, reduction))
}

/// One `--device` name as an autodiff device, telling the trace which path the model's Relation
/// layers take there (they ask for [`relation_kernels::Strategy::Auto`]).
fn open_device(name: &str) -> Result<Device> {
    let device = parse_device(name)?;
    tracing::info!(
        device = name,
        strategy = if relation_kernels::has_kernels(&device) {
            "auto: fused kernels"
        } else {
            "auto: reference (no fused kernels on this device)"
        },
        "device"
    );
    Ok(device.autodiff())
}

/// The Relation switches that differ from the paper's defaults (ablations), as ` (…)`, or
/// nothing.
fn switches(c: &RelationLmConfig) -> String {
    let mut switches = Vec::new();
    if c.tau != relation_core::DEFAULT_TAU {
        switches.push(format!("tau {}", c.tau));
    }
    if c.lambda_init != relation_core::DEFAULT_LAMBDA || !c.lambda_trainable {
        let how = if c.lambda_trainable {
            "init"
        } else {
            "frozen at"
        };
        switches.push(format!("lambda {how} {}", c.lambda_init));
    }
    if !c.givens {
        switches.push("no Givens".into());
    }
    if !c.info_projection && c.pattern.contains('F') {
        switches.push("I = X".into());
    }
    if c.exchange_only && c.pattern.contains('F') {
        switches.push("Exchange-only".into());
    }
    if c.linear_mode != Default::default() && c.pattern.contains('L') {
        switches.push(format!("Linear Relation {}", c.linear_mode));
    }
    if switches.is_empty() {
        String::new()
    } else {
        format!(" ({})", switches.join(", "))
    }
}

/// The GEMM of the Flex dense products, for the start-up line: `, products by faer` or
/// `, products by avx512` (x86-64; nothing elsewhere, where faer is the only one).
fn flex_gemm() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        format!(", products by {}", relation_kernels::flex_gemm().name())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        String::new()
    }
}
