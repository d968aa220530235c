# tensortap: `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test demo lint bench clean

$(STAMP): pyproject.toml setup.py tensortap/transport/_streamcopy.c tensortap/pytorch/_counting.c requirements/test.txt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements/test.txt
	$(VPY) -m pip install -q -e .
	touch $(STAMP)

install: $(STAMP)

test: install
	$(VPY) -m pytest -n 2 -q tests

lint: install
	$(VPY) -m ruff check tensortap tests bench

demo: install
	$(VPY) examples/demo.py

clean:
	rm -rf $(VENV) build *.egg-info
