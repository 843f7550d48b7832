# The two set-up commands: `make demo` and `make test`. Each creates .venv if missing and installs
# the project into it (editable); nothing is expected to be installed by hand.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gristmill-installed
# The CPU build of PyTorch; on this project's machines pip takes it from a wheel already on disk.
TORCH_SPEC ?= torch==2.13.0
# Debian packages the tests serve or drive (a real documentation site to crawl; a headless browser
# that opens the HTML statistics report).
SYSTEM_PACKAGES ?= python3.11-doc chromium chromium-driver

.PHONY: test demo lint system-deps bench-env clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip setuptools wheel
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	# the spec again: on its own, resolving s3fs's exact fsspec pin backtracked into torch 2.14 (a CUDA build)
	$(PY) -m pip install -q "$(TORCH_SPEC)" -e ".[all,test,torch,tokenizers,s3,cluster]"
	touch $(STAMP)

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "note: missing Debian packages:$$missing (tests that need them will fail; install them as root)"; fi; \
	fi

lint: $(STAMP)
	$(PY) -m ruff check .

# two workers, whole files each (a file's module fixtures, e.g. its Ray cluster, stay in one process),
# in the order tests/conftest.py gives them (the modules that share one local Ray first)
test: $(STAMP) system-deps lint
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

demo: $(STAMP)
	$(PY) -m gristmill.pipeline.demo

# Competitors for benchmarks/ live in their own environment so they never change the tested one.
bench-env: pyproject.toml benchmarks/requirements.txt
	test -x .venv-bench/bin/python || $(PYTHON) -m venv .venv-bench
	.venv-bench/bin/python -m pip install -q -U pip setuptools wheel
	.venv-bench/bin/python -m pip install -q "$(TORCH_SPEC)"
	.venv-bench/bin/python -m pip install -q "$(TORCH_SPEC)" -e ".[all,test,tokenizers,s3]"
	.venv-bench/bin/python -m pip install -q "$(TORCH_SPEC)" -r benchmarks/requirements.txt
	.venv-bench/bin/python -m pip install -q --no-deps "mosaicml-streaming==0.13.0" "transformers>=4.40"
	# gristmill as `pip install 'gristmill[all]'` installs it, no test or cluster extras: what
	# benchmarks/pipeline_e2e.py times (the base install alone has no Ray: it is for training nodes)
	test -x .venv-plain/bin/python || $(PYTHON) -m venv .venv-plain
	.venv-plain/bin/python -m pip install -q -U pip setuptools wheel
	.venv-plain/bin/python -m pip install -q -e ".[all]"

clean:
	rm -rf $(VENV) .venv-bench .venv-plain demo-output build *.egg-info
