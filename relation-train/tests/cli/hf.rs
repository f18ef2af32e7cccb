//! `relation export --format hf` and `relation import --from hf`: the folder's layout, a round
//! trip that gives the weights back bit for bit, `relation eval --per-token`, and every refusal
//! naming its problem.

use std::collections::HashMap;
use std::path::Path;

use safetensors::SafeTensors;
use safetensors::tensor::TensorView;

use crate::common::*;

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// `relation export --format hf` of the run `run` into `out`, then `extra` flags.
fn export_args(run: &str, out: &str, extra: &[&str]) -> Vec<String> {
    let mut args = strings(&["export", "--run-dir", run, "--format", "hf", "--out", out]);
    args.extend(strings(extra));
    args
}

/// `relation import --from hf` of `folder` into the new run directory `run`.
fn import_args(folder: &str, run: &str) -> Vec<String> {
    strings(&["import", "--from", "hf", folder, "--run-dir", run])
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A copy of `from` (a flat folder) at `to`.
fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A folder's tensors: name -> (shape, f32 values).
type Tensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// A change made to a copy of an exported folder.
type Edit = Box<dyn Fn(&Path)>;

/// Rewrites `folder/model.safetensors` after `edit` changes its tensors.
fn edit_weights(folder: &Path, edit: impl FnOnce(&mut Tensors)) {
    let path = folder.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Tensors = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, (view.shape().to_vec(), values))
        })
        .collect();
    edit(&mut tensors);
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(name, (shape, values))| {
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (name, shape, bytes)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = data
        .iter()
        .map(|(name, shape, bytes)| {
            let view = TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes).unwrap();
            (name.clone(), view)
        })
        .collect();
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
}

/// Shapes and element types of a folder's tensors.
fn shapes(folder: &Path) -> HashMap<String, (Vec<usize>, String)> {
    let bytes = std::fs::read(folder.join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let metadata = SafeTensors::read_metadata(&bytes).unwrap().1;
    assert_eq!(
        metadata.metadata().as_ref().and_then(|m| m.get("format")),
        Some(&"pt".to_string()),
        "transformers reads safetensors whose metadata names the framework"
    );
    file.tensors()
        .into_iter()
        .map(|(name, view)| (name, (view.shape().to_vec(), view.dtype().to_string())))
        .collect()
}

#[test]
fn hf_folders_round_trip_and_refuse_what_they_cannot_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = corpus(tmp.path());
    let cache = tmp.path().join("cache");
    // One layer of each mixer the folder holds: L (gate), F (λ), A (q, k, v).
    let run = tmp.path().join("run");
    let args = tiny_args(&run, &cache, &corpus);
    let args = with(with(args, "--pattern", "LFA"), "--n-layers", "3");
    let args = with(with(args, "--steps", "2"), "--eval-every", "2");
    ok(&with(
        with(args, "--sample-tokens", "0"),
        "--warmup-steps",
        "1",
    ));
    let r = run.to_str().unwrap();

    // The folder: files, config, names, shapes ([out, in] for linear weights), no lm_head.
    let hf = tmp.path().join("hf");
    let h = hf.to_str().unwrap();
    let out = ok(&export_args(r, h, &[]));
    assert!(out.contains("from_pretrained"), "{out}");
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "configuration_relation.py",
        "modeling_relation.py",
    ] {
        assert!(hf.join(file).is_file(), "{file} missing");
    }
    let config = json(&hf.join("config.json"));
    assert_eq!(config["model_type"], "relation");
    assert_eq!(config["mixer_pattern"], "LFA");
    assert_eq!(config["num_hidden_layers"], 3);
    assert_eq!(config["max_position_embeddings"], 32);
    assert_eq!(config["torch_dtype"], "float32");
    assert_eq!(config["gate_rank"], 16, "resolved to the head dimension");
    assert_eq!(
        config["auto_map"]["AutoModelForCausalLM"],
        "modeling_relation.RelationForCausalLM"
    );
    let vocab = config["vocab_size"].as_u64().unwrap() as usize;
    assert_eq!(
        json(&hf.join("tokenizer_config.json"))["eos_token"],
        "<|endoftext|>"
    );
    let tensors = shapes(&hf);
    let f32 = |dims: &[usize]| (dims.to_vec(), "F32".to_string());
    for (name, expected) in [
        ("model.embed_tokens.weight", f32(&[vocab, 32])),
        ("model.norm.weight", f32(&[32])),
        ("model.layers.0.mlp.gate_proj.weight", f32(&[64, 32])),
        ("model.layers.0.mlp.down_proj.weight", f32(&[32, 64])),
        ("model.layers.0.mixer.gate.down_proj.weight", f32(&[16, 32])),
        ("model.layers.0.mixer.gate.A_log", f32(&[2])),
        ("model.layers.0.mixer.gate.dt_bias", f32(&[32])),
        ("model.layers.0.mixer.givens_angles", f32(&[1])),
        ("model.layers.1.mixer.count_lambda", f32(&[1])),
        ("model.layers.1.mixer.info_proj.weight", f32(&[32, 32])),
        ("model.layers.2.mixer.q_proj.weight", f32(&[32, 32])),
        ("model.layers.2.post_attention_layernorm.weight", f32(&[32])),
    ] {
        assert_eq!(tensors.get(name), Some(&expected), "{name}");
    }
    // 2 + 3 layers × (2 norms + 3 FFN) + L: 4 projections, angles, 4 gate + F: 4, angles, λ + A: 4.
    assert_eq!(tensors.len(), 2 + 15 + 9 + 6 + 4, "{:?}", tensors.keys());
    assert!(!tensors.contains_key("lm_head.weight"), "tied: not stored");

    // `eval --per-token`: one line per window, n + 1 tokens and n log-likelihoods, whose mean
    // is the loss printed.
    let text = tmp.path().join("text.txt");
    std::fs::write(&text, &std::fs::read_to_string(&corpus).unwrap()[..3000]).unwrap();
    let t = text.to_str().unwrap();
    let eval = |run: &str, per_token: &Path| {
        let out = ok(&strings(&[
            "eval",
            "--run-dir",
            run,
            "--data",
            t,
            "--packing",
            "windows",
            "--per-token",
            per_token.to_str().unwrap(),
        ]));
        let loss = out
            .split("loss ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        (
            loss.parse::<f64>().unwrap(),
            std::fs::read_to_string(per_token).unwrap(),
        )
    };
    let (loss, lines) = eval(r, &tmp.path().join("tokens.jsonl"));
    let (mut sum, mut count) = (0.0, 0);
    for line in lines.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let (tokens, logprobs) = (
            row["tokens"].as_array().unwrap(),
            row["logprobs"].as_array().unwrap(),
        );
        assert_eq!(tokens.len(), logprobs.len() + 1);
        assert_eq!(row["packing"], "windows");
        sum -= logprobs.iter().map(|v| v.as_f64().unwrap()).sum::<f64>();
        count += logprobs.len();
    }
    assert!(count > 100 && lines.lines().count() > 3, "{count} tokens");
    assert!(
        (sum / count as f64 - loss).abs() < 1e-3,
        "{} vs {loss}",
        sum / count as f64
    );

    // Import, then the same log-likelihoods bit for bit, and an export of the import that is
    // the first export byte for byte (the weights came back exactly).
    let back = tmp.path().join("back");
    let b = back.to_str().unwrap();
    let out = ok(&import_args(h, b));
    assert!(
        out.contains("3 layers `LFA`") && out.contains("F32"),
        "{out}"
    );
    assert_eq!(eval(b, &tmp.path().join("back.jsonl")).1, lines);
    let hf2 = tmp.path().join("hf2");
    ok(&export_args(b, hf2.to_str().unwrap(), &[]));
    assert_eq!(
        std::fs::read(hf.join("model.safetensors")).unwrap(),
        std::fs::read(hf2.join("model.safetensors")).unwrap()
    );
    assert_eq!(
        json(&hf.join("config.json")),
        json(&hf2.join("config.json"))
    );
    // A folder as transformers 5 saves it (`dtype` for `torch_dtype`, its own keys added, the
    // tokenizer saved apart) imports as well.
    let saved = tmp.path().join("saved");
    copy_folder(&hf, &saved);
    let mut config = json(&saved.join("config.json"));
    let dtype = config
        .as_object_mut()
        .unwrap()
        .remove("torch_dtype")
        .unwrap();
    config["dtype"] = dtype;
    config["transformers_version"] = "5.25.0".into();
    std::fs::write(saved.join("config.json"), config.to_string()).unwrap();
    let saved_run = tmp.path().join("saved-run");
    ok(&import_args(
        saved.to_str().unwrap(),
        saved_run.to_str().unwrap(),
    ));
    assert_eq!(
        eval(saved_run.to_str().unwrap(), &tmp.path().join("saved.jsonl")).1,
        lines
    );
    // Exporting over an earlier export replaces it.
    ok(&export_args(b, h, &[]));

    // bf16: half the bytes, and a round trip of the rounded weights is exact.
    let half = tmp.path().join("bf16");
    let hb = half.to_str().unwrap();
    ok(&export_args(r, hb, &["--dtype", "bf16"]));
    assert_eq!(json(&half.join("config.json"))["torch_dtype"], "bfloat16");
    assert!(shapes(&half).values().all(|(_, dtype)| dtype == "BF16"));
    let size = |p: &Path| {
        std::fs::metadata(p.join("model.safetensors"))
            .unwrap()
            .len()
    };
    assert!(
        size(&half) * 10 < size(&hf) * 6,
        "{} vs {}",
        size(&half),
        size(&hf)
    );
    let back16 = tmp.path().join("back16");
    ok(&import_args(hb, back16.to_str().unwrap()));
    let again = tmp.path().join("bf16-again");
    ok(&export_args(
        back16.to_str().unwrap(),
        again.to_str().unwrap(),
        &["--dtype", "bf16"],
    ));
    assert_eq!(
        std::fs::read(half.join("model.safetensors")).unwrap(),
        std::fs::read(again.join("model.safetensors")).unwrap()
    );

    // Refusals, each naming its problem.
    let import = |folder: &Path, to: &str| import_args(folder.to_str().unwrap(), to);
    let fresh = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    fails_with(&import(&hf, b), &[], "not an empty directory");
    fails_with(&export_args(r, r, &[]), &[], "not an earlier export");
    fails_with(
        &strings(&["export", "--run-dir", r, "--dtype", "f16"]),
        &[],
        "applies to --format hf",
    );
    let set = |key: &'static str, value: serde_json::Value| -> Edit {
        Box::new(move |folder: &Path| {
            let mut config = json(&folder.join("config.json"));
            config[key] = value.clone();
            std::fs::write(folder.join("config.json"), config.to_string()).unwrap();
        })
    };
    let weights = |edit: fn(&mut Tensors)| -> Edit {
        Box::new(move |folder: &Path| edit_weights(folder, edit))
    };
    let vocab_message = format!("the tokenizer has {vocab} tokens but the model's vocabulary");
    let cases: [(&str, Edit, &str); 7] = [
        (
            "llama",
            set("model_type", "llama".into()),
            "model_type is \"llama\"",
        ),
        (
            "vocab",
            set("vocab_size", (vocab + 1).into()),
            &vocab_message,
        ),
        (
            "format",
            set("relation_format", 2.into()),
            "relation_format 2: this build reads layout 1",
        ),
        (
            "missing",
            weights(|t| {
                t.remove("model.layers.1.mixer.count_lambda");
            }),
            "tensor `model.layers.1.mixer.count_lambda` is missing",
        ),
        (
            "misshapen",
            weights(|t| {
                let q = (vec![32, 16], vec![0.5; 512]);
                t.insert("model.layers.2.mixer.q_proj.weight".into(), q);
            }),
            "`model.layers.2.mixer.q_proj.weight` has shape [32, 16], the model needs [32, 32]",
        ),
        (
            "extra",
            weights(|t| {
                t.insert(
                    "model.layers.0.mixer.count_lambda".into(),
                    (vec![1], vec![0.5]),
                );
            }),
            "`model.layers.0.mixer.count_lambda` belongs to no weight",
        ),
        (
            "nan",
            weights(|t| t.get_mut("model.norm.weight").unwrap().1[3] = f32::NAN),
            "`model.norm.weight` holds a value that is not finite",
        ),
    ];
    for (name, edit, message) in cases {
        let folder = tmp.path().join(name);
        copy_folder(&hf, &folder);
        edit(&folder);
        let out = fresh(&format!("{name}-run"));
        fails_with(&import(&folder, &out), &[], message);
        assert!(
            !Path::new(&out).exists(),
            "a refused import ({name}) wrote nothing"
        );
    }

    // A mixer the PyTorch file does not have.
    let retention = tmp.path().join("retention");
    let args = tiny_args(&retention, &cache, &corpus);
    let args = with(with(args, "--pattern", "FN"), "--steps", "2");
    let args = with(with(args, "--eval-every", "2"), "--warmup-steps", "1");
    ok(&with(args, "--sample-tokens", "0"));
    fails_with(
        &strings(&[
            "export",
            "--run-dir",
            retention.to_str().unwrap(),
            "--format",
            "hf",
        ]),
        &[],
        "layer 1 is `N`: only F, L and A layers",
    );
}
