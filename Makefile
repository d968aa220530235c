# tensortap: `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test demo lint bench clean chromium

$(STAMP): pyproject.toml setup.py tensortap/transport/_streamcopy.c tensortap/pytorch/_counting.c requirements/test.txt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements/test.txt
	$(VPY) -m pip install -q -e .
	touch $(STAMP)

install: $(STAMP) chromium

# The browser tests (tests/ui) drive Debian's chromium; install it when we can (root and apt-get), else
# those tests skip with a message saying so.
chromium:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| echo "make: could not install chromium: the browser tests (tests/ui) will skip"; \
	else echo "make: no chromium and no root apt-get: the browser tests (tests/ui) will skip"; fi

test: install
	$(VPY) -m pytest -n 2 -q tests

lint: install
	$(VPY) -m ruff check tensortap tests bench

demo: install
	$(VPY) examples/demo.py

clean:
	rm -rf $(VENV) build *.egg-info
