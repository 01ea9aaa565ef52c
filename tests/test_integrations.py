"""epic.integrations: HuggingFace Llama and Qwen3 patched to run epic programs (the decoder layer's
o_proj..down block and the LM head + cross entropy), on the CPU through the unfused torch form
(fallback="eager"; bench/train_llama.py runs the fused kernels on the H200). A patched model and
an unpatched copy start from the same bf16 weights; the loss and every parameter's gradient agree
within bf16 rounding (the programs keep f32 where HF rounds to bf16: o_proj's output, the logits)."""
import copy
import os

import pytest
import torch

from epic.diagnostics import EpicError

transformers = pytest.importorskip("transformers")
from epic.integrations import apply_epic_to_llama, apply_epic_to_qwen3  # noqa: E402

LOSS_RTOL = 1e-2
GRAD_TOL = 4e-2          # max |g_epic - g_hf| / max |g_hf|, per parameter; a wrong or missing term reads ~1


def _config(kind: str = "llama", **kw):
    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, rms_norm_eps=1e-5,
                  attn_implementation="eager")
    common.update(kw)
    if kind == "qwen3":
        return transformers.Qwen3Config(head_dim=32, **common)      # heads x head_dim = 128: o_proj is [64, 128]
    return transformers.LlamaConfig(**common)


def _model(kind: str = "llama", seed: int = 0, **kw):
    torch.manual_seed(seed)
    cls = transformers.Qwen3ForCausalLM if kind == "qwen3" else transformers.LlamaForCausalLM
    return cls(_config(kind, **kw)).bfloat16()


def _batch(seed: int = 1, ignored: bool = True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (2, 16), generator=g)
    labels = ids.clone()
    if ignored:
        labels[0, :5] = -100               # a prompt that is not trained on
        labels[1, 9] = -100
    return ids, labels


def _loss_and_grads(model, ids, labels, **kw):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, **kw)
    out.loss.backward()
    return out, {n: p.grad.detach().double().clone() for n, p in model.named_parameters()}


def _assert_same_training(ref, patched, no_logits=True, **kw):
    ids, labels = _batch()
    _compare(_loss_and_grads(ref, ids, labels, **kw), _loss_and_grads(patched, ids, labels, **kw), no_logits)


def _compare(want_run, got_run, no_logits=True):
    (want, want_g), (got, got_g) = want_run, got_run
    assert (got.logits is None) == no_logits, "with labels the patched LM head makes no logits"
    torch.testing.assert_close(got.loss.double(), want.loss.double(), rtol=LOSS_RTOL, atol=0)
    assert set(got_g) == set(want_g)
    errors = {n: ((got_g[n] - want_g[n]).abs().max() / want_g[n].abs().max()).item() for n in want_g}
    assert max(errors.values()) < GRAD_TOL, errors


@pytest.mark.parametrize("loss_policy", ["fused", "save"])
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_loss_and_every_gradient_match_huggingface(kind, loss_policy):
    ref = _model(kind)
    patched = copy.deepcopy(ref)
    (apply_epic_to_qwen3 if kind == "qwen3" else apply_epic_to_llama)(patched, fallback="eager",
                                                                       loss_policy=loss_policy)
    _assert_same_training(ref, patched)


@pytest.mark.parametrize("loss_policy", ["fused", "save"])
def test_the_lm_head_s_backward_in_chunks_of_rows(monkeypatch, loss_policy):
    """chunk_rows=7 over 32 tokens: five chunks, the last of 4 rows; the same training as HF's."""
    from epic.integrations import programs
    asked = []
    real = programs.lm_head_loss
    monkeypatch.setattr(programs, "lm_head_loss", lambda *a: asked.append(a) or real(*a))
    ref = _model()
    _assert_same_training(ref, apply_epic_to_llama(copy.deepcopy(ref), fallback="eager", chunk_rows=7,
                                                   loss_policy=loss_policy))
    assert asked == [("eager", 7, loss_policy)]


def test_the_post_attention_norm_s_eps_is_the_model_s():
    """eps 0.5 dwarfs these activations' mean square: a program with another eps would not match."""
    ref = _model(rms_norm_eps=0.5)
    _assert_same_training(ref, apply_epic_to_llama(copy.deepcopy(ref), fallback="eager"))


@pytest.mark.parametrize("loss_kw", ["num_items_in_batch", "shift_labels"])
def test_huggingface_s_loss_arguments(loss_kw):
    """num_items_in_batch (the Trainer's gradient accumulation: the sum over counted tokens divided by
    it) and shift_labels (labels already shifted: used as they are) mean what they mean to HF."""
    ref = _model()
    patched = apply_epic_to_llama(copy.deepcopy(ref), fallback="eager")
    _, labels = _batch(seed=2)
    value = torch.tensor(50) if loss_kw == "num_items_in_batch" else labels
    _assert_same_training(ref, patched, **{loss_kw: value})


@pytest.mark.parametrize("part", ["mlp", "cross_entropy"])
def test_each_part_can_be_patched_alone(part):
    ref = _model()
    patched = apply_epic_to_llama(copy.deepcopy(ref), fallback="eager", **{part: False})
    _assert_same_training(ref, patched, no_logits=part == "mlp")


def test_return_dict_false_gives_a_tuple_led_by_the_loss():
    patched = apply_epic_to_llama(_model(), fallback="eager")
    ids, labels = _batch()
    out = patched(input_ids=ids, labels=labels, return_dict=False)
    assert isinstance(out, tuple)
    torch.testing.assert_close(out[0], patched(input_ids=ids, labels=labels).loss)


def test_gradient_checkpointing_recomputes_the_programs(monkeypatch):
    from epic.integrations import programs
    calls = []
    real = programs.decoder_mlp

    def counted(*a):                  # the program each layer keeps, its runs counted
        program = real(*a)
        return lambda **args: calls.append(a) or program(**args)
    monkeypatch.setattr(programs, "decoder_mlp", counted)
    ref = _model()
    patched = apply_epic_to_llama(copy.deepcopy(ref), fallback="eager")
    for m in (ref, patched):
        (getattr(m, "activation_checkpointing_enable", None) or m.gradient_checkpointing_enable)()
        m.train()
    _assert_same_training(ref, patched)
    assert len(calls) == 2 * 2, "each of the 2 layers runs its program in the forward and again in the backward"


def test_without_labels_the_logits_are_huggingface_s():
    ref = _model()
    patched = apply_epic_to_llama(copy.deepcopy(ref), fallback="eager")
    ids, _ = _batch()
    with torch.no_grad():
        want, got = ref(input_ids=ids).logits.double(), patched(input_ids=ids).logits.double()
    assert got.shape == (2, 16, 128)
    assert ((got - want).abs().max() / want.abs().max()).item() < 2e-2


def test_parameters_and_state_dict_keys_are_unchanged():
    ref = _model()
    patched = apply_epic_to_llama(copy.deepcopy(ref), fallback="eager")
    assert list(patched.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in patched.named_parameters()] == [n for n, _ in ref.named_parameters()]
    patched.load_state_dict(ref.state_dict())          # a checkpoint of either loads into the other


def test_the_whole_patched_model_trains_under_torch_compile():
    """torch.compile of the whole model (attention compiled, epic's programs as custom ops): the same
    loss and gradients as HuggingFace eager. aot_eager: Dynamo and AOTAutograd without a C++ build."""
    ref = _model()
    patched = copy.deepcopy(ref)
    apply_epic_to_llama(patched, fallback="eager")
    o_proj = patched.model.layers[0].self_attn.o_proj
    assert o_proj.weight is patched.get_parameter("model.layers.0.self_attn.o_proj.weight")
    compiled = torch.compile(patched, backend="aot_eager")
    ids, labels = _batch()
    want = _loss_and_grads(ref, ids, labels)
    patched.zero_grad(set_to_none=True)
    out = compiled(input_ids=ids, labels=labels)
    out.loss.backward()
    got = (out, {n: p.grad.detach().double().clone() for n, p in patched.named_parameters()})
    _compare(want, got)


def test_patching_the_classes_applies_to_models_made_afterwards(monkeypatch):
    from transformers.models.llama import modeling_llama as m
    ids, labels = _batch()
    want = _loss_and_grads(_model(), ids, labels)              # before the classes change
    for cls in (m.LlamaDecoderLayer, m.LlamaForCausalLM):         # restored when the test ends
        monkeypatch.setattr(cls, "forward", cls.forward)
        monkeypatch.setattr(cls, "_epic_options", None, raising=False)
    apply_epic_to_llama(fallback="eager")
    _compare(want, _loss_and_grads(_model(), ids, labels))
    monkeypatch.undo()
    assert _model()(input_ids=ids, labels=labels).logits is not None, "undone: HF's forward again"


def test_both_programs_generate_code_forward_and_backward():
    """What the fused path would build (bench/train_llama.py --prebuild lists it the same way): every
    kernel of the forward and backward programs, through code generation (no E702), without nvcc."""
    from epic.integrations import programs
    dims = dict(M=4096, E=1024, D=1024, F=2816, V=32000)
    for f in (programs.decoder_mlp(1e-5, "never"), programs.lm_head_loss("never"),
              programs.lm_head_loss("never", None, "save")):
        for prog in (p for p in (f.forward, f.backward) if p is not None):   # fused: no backward program
            sizes = {k: v for k, v in dims.items() if k in prog.program.dims}
            names = [u.name for _, u in prog.units(sizes)]
            assert names and all(u.source for _, u in prog.units(sizes)), names


def _code(call) -> tuple[str, str]:
    with pytest.raises(EpicError) as info:
        call()
    return info.value.codes[0], str(info.value)


def test_a_model_the_programs_do_not_fit_is_refused_with_e610():
    code, msg = _code(lambda: apply_epic_to_llama(_model(mlp_bias=True), fallback="eager"))
    assert code == "E610" and "bias" in msg
    code, msg = _code(lambda: apply_epic_to_llama(_model(hidden_act="gelu"), fallback="eager"))
    assert code == "E610" and "gelu" in msg
    code, msg = _code(lambda: apply_epic_to_llama(_model().model, fallback="eager"))
    assert code == "E610" and "LlamaForCausalLM" in msg
    code, msg = _code(lambda: apply_epic_to_llama(_model(), fallback="fast"))
    assert code == "E608"
    code, msg = _code(lambda: apply_epic_to_llama(_model(), fallback="eager", loss_policy="recompute"))
    assert code == "E610" and "loss_policy" in msg
    ids, labels = _batch()
    float32 = apply_epic_to_llama(_model().float(), fallback="eager")
    code, msg = _code(lambda: float32(input_ids=ids, labels=labels))
    assert code == "E610" and "bfloat16" in msg


def test_patched_classes_refuse_a_model_they_do_not_fit_when_it_runs(monkeypatch):
    from transformers.models.llama import modeling_llama as m
    for cls in (m.LlamaDecoderLayer, m.LlamaForCausalLM):
        monkeypatch.setattr(cls, "forward", cls.forward)
        monkeypatch.setattr(cls, "_epic_options", None, raising=False)
    apply_epic_to_llama(fallback="eager")
    ids, labels = _batch()
    code, msg = _code(lambda: _model(mlp_bias=True)(input_ids=ids, labels=labels))
    assert code == "E610" and "bias" in msg


def test_a_label_outside_the_vocabulary_is_refused_with_e610():
    patched = apply_epic_to_llama(_model(), fallback="eager")
    ids, labels = _batch()
    for bad in (128, -1):
        labels[1, 3] = bad
        code, msg = _code(lambda: patched(input_ids=ids, labels=labels))
        assert code == "E610" and f"got {bad}" in msg


# FSDP2 (torch.distributed.fsdp.fully_shard) on the CPU with gloo: 2 processes, each half the batch,
# against one process on the whole batch. No label is ignored, so every row counts the same number
# of tokens and the full batch's mean loss is the mean of the two halves'.
STEPS = 2


def _train(model, ids, labels, steps=STEPS):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        losses.append(loss.detach().float())
    return torch.stack(losses)


def _fsdp_worker(rank: int, world: int, port: int, result: str):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), EPIC_LAUNCHER="ctypes")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        model = apply_epic_to_llama(_model(), fallback="eager")
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        assert isinstance(model.lm_head.weight, torch.distributed.tensor.DTensor), "the parameters are sharded"
        ids, labels = _batch(ignored=False)
        losses = _train(model, ids[rank:rank + 1], labels[rank:rank + 1])
        dist.all_reduce(losses)
        if rank == 0:
            torch.save(losses / world, result)
        dist.barrier()           # neither process tears gloo down while the other still talks to it
    finally:
        dist.destroy_process_group()


def test_fsdp2_on_two_cpu_processes_trains_like_one(tmp_path):
    import socket
    import torch.multiprocessing as mp
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch was built without gloo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = str(tmp_path / "losses.pt")
    mp.spawn(_fsdp_worker, args=(2, port, result), nprocs=2, join=True)
    sharded = torch.load(result)
    ids, labels = _batch(ignored=False)
    single = _train(apply_epic_to_llama(_model(), fallback="eager"), ids, labels)
    assert sharded.shape == (STEPS,) and not torch.equal(single[0], single[1]), "the step must change the loss"
    torch.testing.assert_close(sharded, single, rtol=LOSS_RTOL, atol=0)
