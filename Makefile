# tensortap: `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test demo lint bench clean

$(STAMP): pyproject.toml setup.py tensortap/_streamcopy.c tensortap/pytorch/_counting.c requirements/test.txt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements/test.txt
	$(VPY) -m pip install -q -e .
	touch $(STAMP)

install: $(STAMP)

test: install
	$(VPY) -m pytest -n 2 -q tests
	$(MAKE) test-mxnet

# MXNet 1.9.1 needs numpy<1.24: its tests run in a second environment (tests/mxnet skip in the main one).
MXVENV := .venv-mxnet
MXPY := $(MXVENV)/bin/python
MXSTAMP := $(MXVENV)/.installed

$(MXSTAMP): pyproject.toml setup.py requirements/mxnet.txt
	test -x $(MXPY) || $(PY) -m venv $(MXVENV)
	$(MXPY) -m pip install -q --upgrade pip
	$(MXPY) -m pip install -q -r requirements/mxnet.txt
	$(MXPY) -m pip install -q -e .
	$(MXPY) -c "import mxnet" 2>/dev/null || if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -q && apt-get install -y -q libgomp1 libquadmath0; fi
	$(MXPY) -c "import mxnet, numpy; print('mxnet', mxnet.__version__, 'numpy', numpy.__version__)"
	touch $(MXSTAMP)

.PHONY: test-mxnet clean-mxnet
test-mxnet: $(MXSTAMP)
	$(MXPY) -m pytest -q tests/mxnet

clean: clean-mxnet
clean-mxnet:
	rm -rf $(MXVENV)

lint: install
	$(VPY) -m ruff check tensortap tests bench

demo: install
	$(VPY) examples/demo.py

clean:
	rm -rf $(VENV) build *.egg-info
