# Two commands do all set-up on a fresh machine: `make demo` and `make test` (see README.md).
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
PYTEST_ARGS ?=
BENCHES := connector eviction push ingest limits engine_ingest engine faults fleet

.PHONY: install install-browser lint typecheck test test-fast demo bench services clean

install:
	bash scripts/bootstrap.sh

install-browser:
	bash scripts/bootstrap.sh browser

services:
	bash scripts/services.sh

# Static checks (config in pyproject.toml): ruff over the tree, mypy over agent/, and the import contracts
# (the agent imports no Django, the dashboard reaches the agent only through agent.contract, agent layers).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

typecheck: install
	$(VENV)/bin/mypy

# CI runs `make test`: the static checks first, then every test.
test: install-browser lint services
	$(PY) -m pytest $(PYTEST_ARGS)

# Unit tests only: no real services, no browser (markers in pytest.ini).
test-fast: install
	$(PY) -m pytest -m "not integration and not browser" $(PYTEST_ARGS)

# The demo (docs/demo.md): `make demo` runs until Ctrl-C; `make demo ARGS=--once` replays a bounded part of the
# trace, prints the summary and exits 0 only if every check passed. It needs a broker: the Redis answering on
# 127.0.0.1:6379, else the redis-server binary (installed here when missing and run as root); --screenshot needs
# Debian's chromium (installed by install-browser).
demo: install
	@if ! $(PY) -c "import socket; socket.create_connection(('127.0.0.1', 6379), 1)" 2>/dev/null \
	    && ! command -v redis-server >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing redis-server (the demo's broker)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null 2>&1 \
	      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }; \
	  else \
	    echo "error: no Redis on 127.0.0.1:6379 and no redis-server binary (run: sudo apt-get install redis-server)" >&2; \
	    exit 1; \
	  fi; \
	fi
	@case " $(ARGS) " in *" --screenshot"*) $(MAKE) --no-print-directory install-browser ;; esac
	$(PY) -m demo $(ARGS)

bench: install services
	@for b in $(BENCHES); do \
	  if [ -f bench/$$b.py ]; then echo "== bench.$$b"; $(PY) -m bench.$$b || exit 1; fi; \
	done

clean:
	rm -rf $(VENV) var test-artifacts
