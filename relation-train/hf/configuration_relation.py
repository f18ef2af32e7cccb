"""Configuration of a Relation language model exported for Hugging Face transformers.

`relation export --format hf` writes this file next to `config.json`; transformers loads it
with `trust_remote_code=True` and builds `RelationConfig` from the JSON keys. The keys mirror
the Rust `RelationLmConfig` (`relation-model/src/config.rs`) under transformers' usual names:

| config.json               | Rust field          | meaning                                        |
|---------------------------|---------------------|------------------------------------------------|
| `hidden_size`             | `d_model`           | model width `d`                                |
| `num_hidden_layers`       | `n_layers`          | number of blocks                               |
| `num_attention_heads`     | `n_heads`           | heads `H`, head dimension `D = d / H`          |
| `intermediate_size`       | `d_ff`              | SwiGLU hidden width                            |
| `mixer_pattern`           | `pattern`           | `F` / `L` / `A` letters, repeated over layers  |
| `tau`                     | `tau`               | Self temperature `tau_S`                       |
| `lambda_init`             | `lambda_init`       | initial count calibration (weights hold the value) |
| `rope_theta`              | `rope_base`         | RoPE base                                      |
| `rms_norm_eps`            | `norm_eps`          | RMSNorm epsilon                                |
| `gate_rank`               | `gate_rank()`       | rank of the Linear Relation retention gate     |
| `givens`                  | `givens`            | Givens mixing of the information heads         |
| `info_projection`         | `info_projection`   | `I = X W_I` (false: `I = X`) in `F` layers     |
| `exchange_only`           | `exchange_only`     | Exchange-only ablation in `F` layers           |
| `linear_mode`             | `linear_mode`       | how Rust runs `L` layers (same function)       |

The file is self-contained (only transformers is imported) because the exporter embeds it.
"""

from transformers import PretrainedConfig

#: Mixer letters this implementation can run: Full Relation, Linear Relation, attention.
SUPPORTED_MIXERS = "FLA"


class RelationConfig(PretrainedConfig):
    """The shape and switches of a Relation language model (see the module docstring).

    Every argument has the default of the Rust configuration, so a config built with no
    argument describes the trainer's `cpu` preset with the Full Relation pattern.
    """

    model_type = "relation"

    def __init__(
        self,
        vocab_size=4096,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=384,
        mixer_pattern="F",
        tau=2.0,
        lambda_init=0.5,
        lambda_trainable=True,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        gate_rank=None,
        givens=True,
        info_projection=True,
        exchange_only=False,
        linear_mode="recurrent",
        max_position_embeddings=2048,
        initializer_range=0.02,
        relation_format=1,
        tie_word_embeddings=True,
        use_cache=False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.mixer_pattern = mixer_pattern
        self.tau = tau
        self.lambda_init = lambda_init
        self.lambda_trainable = lambda_trainable
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        # The exporter writes the resolved rank; 0 or None means the head dimension, as in Rust.
        if not gate_rank:
            gate_rank = hidden_size // max(num_attention_heads, 1)
        self.gate_rank = gate_rank
        self.givens = givens
        self.info_projection = info_projection
        self.exchange_only = exchange_only
        self.linear_mode = linear_mode
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.relation_format = relation_format
        # The model keeps no cache: every generation step recomputes the whole prefix.
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def mixer_kinds(self):
        """The mixer letter of every layer: `mixer_pattern` (whitespace ignored) repeated to
        `num_hidden_layers`, layer `i` taking letter `i % len(pattern)`.

        Raises `ValueError` for an empty pattern or a letter this implementation cannot run
        (the Rust baselines `R`, `N`, `K` are not exported).
        """
        letters = [c for c in str(self.mixer_pattern) if not c.isspace()]
        if not letters:
            raise ValueError("mixer_pattern is empty")
        unknown = sorted({c for c in letters if c not in SUPPORTED_MIXERS})
        if unknown:
            raise ValueError(
                f"mixer_pattern {self.mixer_pattern!r} has mixers {unknown} that this "
                f"implementation does not support (only {SUPPORTED_MIXERS!r})"
            )
        return [letters[i % len(letters)] for i in range(self.num_hidden_layers)]
