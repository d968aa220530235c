# tensortap: `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed
# smdebug 1.0.34 in its own venv, for the differential test (tests/differential)
SMD_VENV := .venv-smdebug
SMD_STAMP := $(SMD_VENV)/.installed

.PHONY: install demo-install smdebug-venv test demo lint bench clean chromium spark

$(STAMP): pyproject.toml setup.py tensortap/transport/_streamcopy.c tensortap/capture/_moments.c requirements/test.txt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements/test.txt
	$(VPY) -m pip install -q -e .
	touch $(STAMP)

install: $(STAMP) chromium

# `make demo` installs only what the demo needs (requirements/demo.txt, ~0.9 GB, mostly PyTorch) into the same
# .venv, which `make test` later completes. --no-compile, then `demo.py --prepare`: Python compiles the modules
# the demo imports, once (even where PYTHONDONTWRITEBYTECODE is set), instead of pip compiling all of PyTorch up
# front (half of the install's time) or each of the demo's processes compiling what it imports.
$(DEMO_STAMP): pyproject.toml setup.py tensortap/transport/_streamcopy.c tensortap/capture/_moments.c requirements/demo.txt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --no-compile -r requirements/demo.txt
	$(VPY) -m pip install -q --no-compile --no-build-isolation -e .
	PYTHONDONTWRITEBYTECODE= $(VPY) examples/demo.py --prepare
	touch $(DEMO_STAMP)

demo-install: $(DEMO_STAMP)

# The browser tests (tests/ui) drive Debian's chromium; install it when we can (root and apt-get), else
# those tests skip with a message saying so.
chromium:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| echo "make: could not install chromium: the browser tests (tests/ui) will skip"; \
	else echo "make: no chromium and no root apt-get: the browser tests (tests/ui) will skip"; fi

# Spark (tests/export/test_export_spark.py): pyspark in .venv and a Java runtime, installed when we can (root and
# apt-get), else that test skips with a message saying so.
SPARK_STAMP := $(VENV)/.spark-installed
$(SPARK_STAMP): requirements/spark.txt $(STAMP)
	$(VPY) -m pip install -q -r requirements/spark.txt
	touch $(SPARK_STAMP)

spark:
	@$(MAKE) --no-print-directory $(SPARK_STAMP) || echo "make: could not install pyspark: the Spark test will skip"
	@if command -v java >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null) \
		|| echo "make: could not install a Java runtime: the Spark test will skip"; \
	else echo "make: no Java and no root apt-get: the Spark test will skip"; fi

$(SMD_STAMP): requirements/smdebug.txt
	test -x $(SMD_VENV)/bin/python || $(PY) -m venv $(SMD_VENV)
	$(SMD_VENV)/bin/python -m pip install -q -r requirements/smdebug.txt
	touch $(SMD_STAMP)

smdebug-venv: $(SMD_STAMP)

# The differential test runs against smdebug when its venv could be built, and is skipped (saying why) otherwise.
# The MXNet tests run first in their own environment; the whole suite's summary is the last line. ruff first: a
# lint finding fails the suite as a test does.
test: install
	$(VPY) -m ruff check tensortap tests bench
	$(MAKE) spark
	$(MAKE) test-mxnet
	$(MAKE) smdebug-venv || echo "smdebug 1.0.34 environment could not be built: tests/differential will be skipped"
	TENSORTAP_SMDEBUG_PYTHON="$$(test -f $(SMD_STAMP) && echo $(CURDIR)/$(SMD_VENV)/bin/python)" \
		$(VPY) -m pytest -n 2 --dist loadgroup -q tests

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

demo: $(DEMO_STAMP)
	$(VPY) examples/demo.py

clean:
	rm -rf $(VENV) $(SMD_VENV) build *.egg-info
