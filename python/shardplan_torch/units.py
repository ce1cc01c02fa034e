"""Units: how a model's modules map onto shardplan's units (`embedding`, `block.1..L`, `head`,
in forward order), shared by the hooks profiler and `apply_plan`.

A unit owns the parameters of its `modules`, which FSDP2 shards as one group (tied parameters
must share one group: GPT-2's `lm_head` belongs to the embedding, which owns `wte`). Its
`compute` modules are the ones whose forward is the unit's compute, in forward order (GPT-2's
head computes `ln_f` and then the tied `lm_head`); by default its `modules`. A unit whose compute
reads another unit's parameters names that unit in `reads_params_of`, as the runtime's profiles
do (GPT-2's head reads the embedding's `wte`).

`units(model)` gives the map of transformers' GPT-2 (`GPT2LMHeadModel`) and of the Llama-shaped
families (`LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`,
`Gemma2ForCausalLM`, `Gemma3ForCausalLM`, `Phi3ForCausalLM`, `Olmo2ForCausalLM`: `model.embed_tokens`,
`model.layers`, `model.norm`, `lm_head`); `check(model, units)` refuses a map that leaves a
parameter out or names one twice. For another model, write the list yourself (README, "A unit map
for another model").
"""

from dataclasses import dataclass, field


@dataclass
class Unit:
    name: str
    modules: list
    compute: list = field(default_factory=list)
    reads_params_of: str | None = None

    def __post_init__(self):
        if not self.modules:
            raise ValueError(f"unit {self.name!r} has no modules")
        if not self.compute:
            self.compute = list(self.modules)

    def parameters(self):
        """The unit's parameters, each once (tied ones appear under several modules)."""
        seen, out = set(), []
        for module in self.modules:
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out


def as_units(units):
    """`units` as `Unit`s: `Unit`s are kept; a pair (name, module) or (name, [modules]) is a unit
    of those modules."""
    out = []
    for u in units:
        if isinstance(u, Unit):
            out.append(u)
            continue
        name, modules = u
        out.append(Unit(name, list(modules) if isinstance(modules, (list, tuple)) else [modules]))
    return out


def _gpt2(model):
    t = model.transformer
    blocks = [Unit(f"block.{i + 1}", [h]) for i, h in enumerate(t.h)]
    tied = model.lm_head.weight is t.wte.weight
    embedding = [t.wte, t.wpe, model.lm_head] if tied else [t.wte, t.wpe]
    head = [t.ln_f] if tied else [t.ln_f, model.lm_head]
    return [Unit("embedding", embedding, compute=[t.wte, t.wpe]), *blocks,
            Unit("head", head, compute=[t.ln_f, model.lm_head],
                 reads_params_of="embedding" if tied else None)]


def _decoder(model):
    m = model.model
    blocks = [Unit(f"block.{i + 1}", [layer]) for i, layer in enumerate(m.layers)]
    tied = model.lm_head.weight is m.embed_tokens.weight
    embedding = [m.embed_tokens, model.lm_head] if tied else [m.embed_tokens]
    head = [m.norm] if tied else [m.norm, model.lm_head]
    return [Unit("embedding", embedding, compute=[m.embed_tokens]), *blocks,
            Unit("head", head, compute=[m.norm, model.lm_head],
                 reads_params_of="embedding" if tied else None)]


_DECODERS = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
             "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "Olmo2ForCausalLM"]
_MAPS = {"GPT2LMHeadModel": _gpt2, **{name: _decoder for name in _DECODERS}}


def units(model):
    """The unit map of `model`, chosen by its class: transformers' `GPT2LMHeadModel` or one of the
    Llama-shaped `*ForCausalLM`s (or a subclass). Checked: every parameter in exactly one unit."""
    for cls in type(model).__mro__:
        if cls.__name__ in _MAPS:
            found = _MAPS[cls.__name__](model)
            check(model, found)
            return found
    raise ValueError(
        f"no unit map for {type(model).__name__}: shardplan_torch.units knows "
        f"{', '.join(sorted(_MAPS))}; for another model write the list yourself, in forward "
        "order and named as the profile's units: [Unit('embedding', [the token embedding, and "
        "the output projection if tied]), Unit('block.1', [first block]), ..., Unit('block.L', "
        "[last block]), Unit('head', [final norm, output projection], reads_params_of='embedding' "
        "if tied)], then shardplan_torch.check_units(model, that_list) (README: 'A unit map for "
        "another model')")


def check(model, unit_list):
    """Refuses a unit list that leaves a parameter of `model` out or puts one in two units,
    naming the parameters. Returns the list as `Unit`s."""
    unit_list = as_units(unit_list)
    owners = {}
    for u in unit_list:
        for p in u.parameters():
            owners.setdefault(id(p), []).append(u.name)
    named = list(model.named_parameters())
    missing = [n for n, p in named if id(p) not in owners]
    if missing:
        raise ValueError(f"parameters in no unit: {', '.join(missing)} (every parameter must "
                         "belong to exactly one unit; tied ones to the unit that owns the tie)")
    twice = [f"{n} ({' and '.join(owners[id(p)])})" for n, p in named if len(owners[id(p)]) > 1]
    if twice:
        raise ValueError(f"parameters in two units: {', '.join(twice)}; put tied modules in one "
                         "unit, as FSDP2 asks")
    return unit_list
