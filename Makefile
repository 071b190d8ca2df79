# Two commands do all set-up on a fresh machine: `make demo` and `make test` (see README.md).
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
PYTEST_ARGS ?=
BENCHES := connector eviction push ingest

.PHONY: install install-browser test demo bench services clean

install:
	bash scripts/bootstrap.sh

install-browser:
	bash scripts/bootstrap.sh browser

services:
	bash scripts/services.sh

test: install-browser services
	$(PY) -m pytest $(PYTEST_ARGS)

demo: install
	$(PY) -m demo $(ARGS)

bench: install services
	@for b in $(BENCHES); do \
	  if [ -f bench/$$b.py ]; then echo "== bench.$$b"; $(PY) -m bench.$$b || exit 1; fi; \
	done

clean:
	rm -rf $(VENV) var test-artifacts
