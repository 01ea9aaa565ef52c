"""Train a HuggingFace Llama with epic programs, forward and backward (the way Liger's
apply_liger_kernel_to_llama patches a model):

    model = LlamaForCausalLM(config).bfloat16().cuda()
    epic.integrations.apply_epic_to_llama(model)
    loss = model(input_ids=ids, labels=labels).loss       # no logits are made
    loss.backward()

Each decoder layer's o_proj + residual + post-attention RMSNorm + gate/up + SwiGLU + down + residual
runs as one program (programs.DECODER_MLP), and the LM head + cross entropy as another
(programs.LM_HEAD_LOSS); their backward programs are derived by epic (epic.autograd). Attention, the
input RMSNorm, the embedding and the final norm stay HuggingFace's. Parameters and state_dict keys
are not changed: the interleaved gate/up operand is built from gate_proj and up_proj on each call,
and a patched instance's o_proj becomes a module holding the same weight whose forward returns its
input (the program does o_proj), so that torch.compile of the whole model traces the layer.
"""
from __future__ import annotations

import inspect
import types

import torch

from ..diagnostics import error
from . import programs

# a patched class -> HF's forward: the patched one binds arguments by it and runs it where epic does not apply
_ORIGINAL: dict[type, types.FunctionType] = {}
LOSS_POLICIES = ("fused", "save")


def apply_epic_to_llama(model=None, *, mlp: bool = True, cross_entropy: bool = True, fallback: str = "never",
                        chunk_rows: int | None = None, loss_policy: str = "fused"):
    """Patch a LlamaForCausalLM instance (or, with model=None, the classes: every Llama model runs
    epic). fallback: as epic.compile's ("eager" runs the unfused torch form: no GPU). chunk_rows:
    the LM head runs on that many tokens at a time (epic.autograd's chunk_rows), so its [tokens,
    vocab] logit gradient is [chunk_rows, vocab]. loss_policy: "fused" (the LM head's gradients
    computed in its forward, 3 gemms) or "save" (a backward program recomputing the logits, 4)."""
    from transformers.models.llama import modeling_llama as m
    return apply_epic(m.LlamaForCausalLM, m.LlamaDecoderLayer, model, mlp=mlp, cross_entropy=cross_entropy,
                      fallback=fallback, chunk_rows=chunk_rows, loss_policy=loss_policy)


def apply_epic(causal_cls: type, layer_cls: type, model=None, *, mlp: bool = True, cross_entropy: bool = True,
               fallback: str = "never", chunk_rows: int | None = None, loss_policy: str = "fused"):
    """Patch a model whose decoder layers are Llama's (self_attn.o_proj, post_attention_layernorm,
    mlp.gate_proj/up_proj/down_proj) and whose causal-LM head is model.lm_head."""
    from ..runtime.compiled import FALLBACKS
    if fallback not in FALLBACKS:
        raise error("E608", f"fallback must be one of {', '.join(FALLBACKS)}, got {fallback!r}")
    if loss_policy not in LOSS_POLICIES:
        raise error("E610", f"loss_policy must be one of {', '.join(LOSS_POLICIES)}, got {loss_policy!r}")
    originals = {"layer": _ORIGINAL.setdefault(layer_cls, layer_cls.forward),
                 "causal": _ORIGINAL.setdefault(causal_cls, causal_cls.forward)}
    options = {"fallback": fallback, "chunk_rows": chunk_rows, "loss_policy": loss_policy,
               "layer_returns_tuple": _returns_tuple(originals["layer"]),
               **originals}
    if model is None:
        if mlp:
            layer_cls.forward = _fused_layer_class(layer_cls).forward
            layer_cls._epic_options = options
        if cross_entropy:
            causal_cls.forward = _causal_lm_forward
            causal_cls._epic_options = options
        return None
    if not isinstance(model, causal_cls):
        raise error("E610", f"expected a {causal_cls.__name__}, got {type(model).__name__}",
                    hint="pass the causal-LM model itself (the one with .lm_head), or model=None to patch the classes")
    if mlp:
        for layer in [mod for mod in model.modules() if isinstance(mod, layer_cls)]:
            _check_layer(layer)
            layer._epic_options = options
            layer._epic_program = programs.decoder_mlp(_eps(layer.post_attention_layernorm), fallback)
            if not isinstance(layer.self_attn.o_proj, _DeferredProjection):
                layer.self_attn.o_proj = _DeferredProjection(layer.self_attn.o_proj)
            if not isinstance(layer, tuple(_FUSED.values())):
                layer.__class__ = _fused_layer_class(type(layer))
    if cross_entropy:
        _check_lm_head(model)
        model._epic_options = options
        model._epic_lm_head = programs.lm_head_loss(fallback, chunk_rows, loss_policy)
        model.forward = types.MethodType(_causal_lm_forward, model)
    return model


_FUSED: dict[type, type] = {}


def _fused_layer_class(cls: type) -> type:
    """cls with the fused forward. A subclass, not a forward set on the instance: transformers 5 wraps
    each decoder layer class's forward for gradient checkpointing as the class is made (only the
    class's own forward checkpoints), and state_dict keys do not depend on the class."""
    if cls not in _FUSED:
        name = f"Epic{cls.__name__}"
        _FUSED[cls] = type(name, (cls,), {"forward": _decoder_forward, "__module__": __name__, "__qualname__": name})
        globals()[name] = _FUSED[cls]      # found by name, as pickle looks a class up
    return _FUSED[cls]


def _check_layer(layer) -> None:
    mlp, attn = layer.mlp, layer.self_attn
    linears = {"self_attn.o_proj": attn.o_proj, "mlp.gate_proj": mlp.gate_proj, "mlp.up_proj": mlp.up_proj,
               "mlp.down_proj": mlp.down_proj}
    for name, lin in linears.items():
        if getattr(lin, "bias", None) is not None:
            raise error("E610", f"{name} has a bias; the epic decoder program has none",
                        hint="patch with mlp=False (config.attention_bias / config.mlp_bias)")
    act = getattr(getattr(mlp, "config", None), "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise error("E610", f"the MLP's activation is {act!r}; the epic decoder program computes SwiGLU (silu)",
                    hint="patch with mlp=False")


def _check_lm_head(model) -> None:
    if getattr(model.lm_head, "bias", None) is not None:
        raise error("E610", "lm_head has a bias; the epic cross-entropy program has none",
                    hint="patch with cross_entropy=False")


def _bf16(what: str, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype != torch.bfloat16:
            raise error("E610", f"{what} is {t.dtype}; the epic programs take bfloat16",
                        hint="convert the model with model.bfloat16() (or patch with mlp=False, cross_entropy=False)")


class _DeferredProjection(torch.nn.Module):
    """A patched instance's o_proj: the same weight (the same Parameter: state_dict keys, optimizers and
    FSDP see no change) and a forward that returns its input, because the layer's program does o_proj.
    A module set once, not a forward swapped around each self_attn call, so that torch.compile can
    trace the layer."""

    def __init__(self, linear: torch.nn.Module):
        super().__init__()
        self.weight = linear.weight
        self.register_parameter("bias", None)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x):
        return x


class _Bypassed:
    """With the classes patched (model=None), o_proj returns its input while the fused layer runs
    self_attn: the program does o_proj."""

    def __init__(self, linear: torch.nn.Module):
        self.linear = linear

    def __enter__(self):
        self.linear.forward = _identity

    def __exit__(self, *exc):
        del self.linear.forward


def _identity(x):
    return x


def _decoder_forward(self, hidden_states, **kwargs):
    """The layer with its second half as one program; the rest (attention's arguments: the mask,
    position embeddings, cache...) goes to self_attn as HuggingFace's layer passes it."""
    _check_layer(self)          # again: patching the classes checked no layer
    mlp, norm, wo = self.mlp, self.post_attention_layernorm, self.self_attn.o_proj.weight
    _bf16("the decoder layer's input", hidden_states)
    _bf16("a decoder layer's weight", wo, norm.weight, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    residual = hidden_states
    if isinstance(self.self_attn.o_proj, _DeferredProjection):
        attn = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)[0]
        program = self._epic_program
    else:                       # the classes patched: no instance was prepared
        with _Bypassed(self.self_attn.o_proj):
            attn = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)[0]
        program = programs.decoder_mlp(_eps(norm), self._epic_options["fallback"])
    # the [D, 2F] K-major gate/up operand: rows 2k, 2k+1 of the [2F, D] stack are gate_k, up_k
    wgu = torch.stack((mlp.gate_proj.weight, mlp.up_proj.weight), dim=1).reshape(-1, mlp.gate_proj.weight.shape[1]).t()
    d = residual.shape[-1]
    y = program(attn=attn.reshape(-1, attn.shape[-1]), wo=wo.t(), z=residual.reshape(-1, d), gamma=norm.weight,
                wgu=wgu, wd=mlp.down_proj.weight.t())["y"]
    y = y.reshape(residual.shape)
    return (y,) if self._epic_options["layer_returns_tuple"] else y


def _eps(norm) -> float:
    return float(getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6))


def _returns_tuple(forward) -> bool:
    """Older transformers' decoder layers return (hidden_states, ...); 4.54 and later the tensor."""
    annotation = inspect.signature(forward).return_annotation
    return "tuple" in str(annotation).lower()


def _causal_lm_forward(self, *args, **kwargs):
    original = self._epic_options["causal"]
    bound = inspect.signature(original).bind(self, *args, **kwargs).arguments
    bound.pop("self", None)
    labels = bound.pop("labels", None)
    if labels is None:
        return types.MethodType(original, self)(**bound.pop("kwargs", {}), **bound)
    _check_lm_head(self)
    logits_to_keep = bound.pop("logits_to_keep", 0)
    extra = bound.pop("kwargs", {})
    return_dict = bound.pop("return_dict", extra.pop("return_dict", None))   # a decorator's argument in transformers 5
    num_items = extra.get("num_items_in_batch")
    shift_labels = extra.pop("shift_labels", None)
    ignore_index = extra.pop("ignore_index", -100)
    outputs = self.model(**bound, **extra)
    hidden = outputs[0]
    if isinstance(logits_to_keep, int):
        hidden = hidden[:, -logits_to_keep:, :] if logits_to_keep else hidden
    else:
        hidden = hidden[:, logits_to_keep, :]
    loss = lm_head_loss(self, hidden, labels, shift_labels, num_items, ignore_index)
    from transformers.modeling_outputs import CausalLMOutputWithPast
    rest = {k: v for k, v in outputs.items() if k != "last_hidden_state"} if hasattr(outputs, "items") else {}
    result = CausalLMOutputWithPast(loss=loss, logits=None, **rest)
    return result.to_tuple() if return_dict is False else result


def lm_head_loss(model, hidden: torch.Tensor, labels: torch.Tensor | None, shift_labels: torch.Tensor | None = None,
                 num_items_in_batch=None, ignore_index: int = -100) -> torch.Tensor:
    """HuggingFace's causal-LM loss (labels shifted left, ignore_index rows not counted, the mean over
    counted tokens or the sum over num_items_in_batch) by the LM head + cross entropy program."""
    vocab = model.lm_head.weight.shape[0]
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    label = shift_labels.reshape(-1).to(hidden.device)
    bad = ((label < 0) & (label != ignore_index)) | (label >= vocab)
    if bool(bad.any()):
        raise error("E610", f"a label is outside the vocabulary [0, {vocab}) and is not ignore_index "
                    f"({ignore_index}): got {int(label[bad][0])}", hint="check the tokenizer's vocabulary against "
                    "config.vocab_size, and mark tokens not trained on with ignore_index")
    label = torch.where(label == ignore_index, -1, label).to(torch.int32)
    x = hidden.reshape(-1, hidden.shape[-1]).contiguous()
    _bf16("the LM head's input", x)
    _bf16("lm_head.weight", model.lm_head.weight)
    options = model._epic_options
    program = getattr(model, "_epic_lm_head", None) or \
        programs.lm_head_loss(options["fallback"], options["chunk_rows"], options.get("loss_policy", "fused"))
    count = (label >= 0).sum() if num_items_in_batch is None else num_items_in_batch
    if torch.is_tensor(count):
        count = count.to(x.device)
    if options.get("loss_policy", "fused") == "fused":
        # each counted token's weight in the loss, known now: the forward computes the gradients
        weights = (label >= 0).to(torch.float32) / count
        return program(x=x, w=model.lm_head.weight.t(), label=label, d_loss=weights)[0]
    rows = program(x=x, w=model.lm_head.weight.t(), label=label)["loss"]
    return rows.sum() / count
