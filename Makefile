# OwlLayer Server: the README's commands.
#   make run    start a local server on 127.0.0.1:$PORT (default 8000) with a demo key
#   make test   the suite on SQLite + in-memory layer, then on PostgreSQL + Redis
#   make bench  the benchmarks (bench/)
#   make mutate mutation testing of the code that carries the promises (docs/mutation.md)
#   make widget-release RELEASE=x.y.z   cut a release of the drop-in widget (docs/widget.md)

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# What is installed in the virtualenv, one stamp per requirements file:
# `make run` needs only requirements.txt; `make test`, `make lint`,
# `make bench` and `make mutate` need requirements-dev.txt (which includes
# it). A virtualenv made by `make run` gets the rest at the first `make test`.
RUNTIME_STAMP := $(VENV)/.installed-runtime
DEV_STAMP := $(VENV)/.installed

# The second test pass; both must answer, or it is skipped (a failure in CI).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
TEST_REDIS_URL ?= redis://127.0.0.1:6379/0
# A hung test fails instead of hanging CI.
PYTEST := $(PY) -m pytest -p no:cacheprovider --timeout=120
PYTEST_ARGS ?=
# Options of `python -m bench`, e.g. make bench BENCH_ARGS="--quick --json bench.json"
BENCH_ARGS ?=
# `make bench` measures both backends; the PostgreSQL server where it creates
# (and drops) a scratch database, and the Redis it uses under a prefix of its own.
BENCH_POSTGRES ?= postgres://postgres@127.0.0.1:5432
BENCH_REDIS ?= redis://127.0.0.1:6379/0
# The functions `make mutate` mutates (mutmut mutant-name globs; setup.cfg
# lists the files and the tests that run). Narrow it, e.g.
#   make mutate MUTANTS='approvals.audit.*'
MUTANTS ?= 'aitp.store.keys.x_api_key_lookup__*' 'aitp.store.keys.x_key_hash__*' \
	'aitp.store.admission.x_api_key_refusal__*' 'aitp.store.admission.x_refusal__*' \
	'aitp.store.admission.x_live_sessions_filter__*' \
	'aitp.store.plain.xǁPlainStoreǁsession_open__*' 'aitp.store.fast.xǁFastStoreǁsession_open__*' \
	'aitp.store.fast.xǁFastStoreǁ_open_locked__*' 'aitp.services.x_sessions_close_stale__*' \
	'aitp.ledger.*' 'approvals.audit.*' 'approvals.services.*' \
	'approvals.models.x_policy_parties__*' 'aitp.tools.xǁRiskǁhighest__*' 'aitp.calls.*' \
	'agent.server_tools.xǁServerToolsǁrun__*' \
	'agent.server_tools.xǁServerToolsǁawait_decision__*' \
	'agent.approvals.xǁApprovalsǁapply_row__*' \
	'llm.anthropic_backend.x_new_client__*' \
	'llm.anthropic_backend.xǁCappedRetriesǁ*' 'llm.anthropic_backend.x_should_retry__*' \
	'llm.anthropic_backend.x__asked_wait__*' 'llm.anthropic_backend.x__retry_after__*' \
	'llm.anthropic_backend.x_get_client__*' \
	$(MUTANTS_EDGES)
# Promises that once could break with every test still green: per promise,
# the functions that decide it (numbered as in docs/mutation.md).
#  9 a high- or critical-risk page call answered by a bare TOOL_RESULT is refused
# 10 a cancelled turn's finished calls keep their real outcome for the model
# 11 disabling a key or changing its expiry closes or re-checks its live sessions
# 12 the admin's bulk key actions change only keys of tenants the user owns
# 13 an operator who loses access to a tenant stops getting its sessions at once
# 14 OWLLAYER_MAX_ACTIVE_TOOLS is what the session enforces and announces
# 15 webhooks: a current signed timestamp, the certificate checked for the
#     url's host name, no proxy from the environment
# 16 a WAV whose header rate is out of range is refused like a live chunk
# 17 an APPROVAL_REQUEST for other arguments than the call's is refused in a turn
MUTANTS_EDGES := \
	'agent.page_tools.xǁPageToolsǁon_tool_result__*' 'agent.approvals.xǁApprovalsǁskipped__*' \
	'agent.loop.x__settle_cut_calls__*' 'agent.loop.x__to_the_end__*' 'agent.loop.x__cancel_message__*' \
	'aitp.tenancy.x_key_update__*' 'console.admin.xǁApiKeyAdminǁsave_model__*' \
	'console.admin.xǁApiKeyAdminǁ_owned__*' 'tenants.selectors.x_changeable_tenant_ids__*' \
	'operators.access.x_access_changed__*' 'operators.access.x__membership_saved__*' \
	'operators.access.x__account_saved__*' 'operators.access.x__account_deleted__*' \
	'operators.consumer.xǁOperatorWatchConsumerǁwatch_access__*' 'operators.consumer.x__tenant_groups__*' \
	'aitp.session.xǁSessionMachineǁ_context_update__*' 'aitp.session.xǁSessionMachineǁaccept_handshake__*' \
	'approvals.webhooks.x_call_webhook__*' 'approvals.webhooks.x__pinned__*' 'approvals.webhooks.x_sign__*' \
	'aitp.voice.inbound.*' 'aitp.voice.audio.x_decode_wav__*' 'aitp.voice.audio.x_pcm_rate__*' \
	'aitp.voice.audio.x_is_wav_mime__*' \
	'agent.approvals.xǁApprovalsǁon_approval_request__*' 'agent.approvals.xǁApprovalsǁasked__*' \
	'agent.approvals.xǁApprovalsǁopened__*'

.PHONY: help setup runtime chromium espeak nodejs nginx run test bench mutate widget-release lint lint-only clean distclean

help:
	@echo "make setup   create .venv, install requirements-dev.txt, Chromium, eSpeak NG, Node.js and nginx"
	@echo "make run     install requirements.txt and eSpeak NG only, migrate, ensure the demo key and"
	@echo "             sign-ins, serve on 127.0.0.1:\$${PORT:-8000}"
	@echo "make test    run the suite (SQLite, then PostgreSQL + Redis when they answer)"
	@echo "make bench   run the benchmarks (both backends; nginx for the two-process line)"
	@echo "make mutate  mutation testing of the promise-carrying code (tens of minutes)"
	@echo "make widget-release RELEASE=x.y.z   cut a release of the widget from static/owllayer/"
	@echo "             (the current one stays served from widget/releases/; docs/widget.md)"
	@echo "make lint    ruff over all Python code, mypy over the pure core, vulture for dead code"
	@echo "make clean   remove caches and test databases"
	@echo "make distclean   also the virtualenv, db.sqlite3, .demo-key and .demo-logins"

# Everything the tests, the linters and the benchmarks use.
setup: $(DEV_STAMP) chromium espeak nodejs nginx

# Only what serving needs: the runtime requirements and the offline voice.
runtime: $(RUNTIME_STAMP) espeak

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall only when a requirements file is newer than the last install.
$(RUNTIME_STAMP): requirements.txt | $(PY)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	touch $@

# requirements-dev.txt includes requirements.txt: both are installed then.
$(DEV_STAMP): requirements.txt requirements-dev.txt | $(PY)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $@ $(RUNTIME_STAMP)

# Browser tests drive Debian's Chromium (no browser downloads here).
chromium:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then \
		true; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian chromium and chromium-driver"; \
		apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium chromium-driver; \
	else \
		echo "note: /usr/bin/chromium is missing and we are not root;" \
			"browser tests will be skipped (as root: apt-get install chromium chromium-driver)"; \
	fi

# The offline text-to-speech engine (OWLLAYER_TTS=espeak) is Debian's eSpeak NG.
espeak:
	@if [ -x /usr/bin/espeak-ng ]; then \
		true; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian espeak-ng"; \
		apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends espeak-ng; \
	else \
		echo "note: /usr/bin/espeak-ng is missing and we are not root;" \
			"voice is off and its tests are skipped (as root: apt-get install espeak-ng)"; \
	fi

# The browser client's argument checks run under Debian's Node.js against the
# same cases as the server's (tests/test_tool_argument_cases.py).
nodejs:
	@if command -v node >/dev/null; then \
		true; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian nodejs"; \
		apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs; \
	else \
		echo "note: node is missing and we are not root;" \
			"the browser client's argument cases are skipped (as root: apt-get install nodejs)"; \
	fi

# Local use: debug mode unless a real secret is given (settings refuse to
# start without a secret otherwise). owllayer_site.serve is daphne serving
# owllayer_site.asgi:application, with the frame ceiling from settings.
# A port in use stops the run before anything is migrated or changed, so a
# second `make run` never disturbs the first; ensure_demo ends by printing
# the store, admin and console addresses and their sign-ins.
run: runtime
	@set -euo pipefail; \
	if [ -z "$${DJANGO_SECRET_KEY:-}" ]; then export DJANGO_DEBUG="$${DJANGO_DEBUG:-true}"; fi; \
	port="$${PORT:-8000}"; \
	$(PY) -m owllayer_site.serve --check-port --bind 127.0.0.1 --port "$$port"; \
	$(PY) manage.py migrate --noinput; \
	$(PY) manage.py ensure_demo --port "$$port"; \
	exec $(PY) -m owllayer_site.serve --bind 127.0.0.1 --port "$$port"

# Pass 1 always runs on the embedded default. Pass 2 needs PostgreSQL and
# Redis; without them it is skipped with a note, except in CI (CI=true).
# The two passes share nothing (own test databases, own Redis prefix, own
# artifacts) and run at the same time; pass 2's output is printed after
# pass 1's, from test-artifacts/pass-2.log.
# pytest's exit 5 ("no tests ran") counts as a failure. Browser tests save
# screenshots of each step under test-artifacts/<pass>/screenshots/.
# Lint first: a lint failure fails the run, and the tests still run after it.
test: setup
	@set -uo pipefail; status=0; \
	echo "=== lint"; \
	if ! { $(LINT); }; then echo "=== lint: FAILED"; status=1; fi; \
	run_pass() { \
		local name="$$1"; shift; \
		echo "=== $$name"; \
		env "$$@" $(PYTEST) $(PYTEST_ARGS); \
		local code=$$?; \
		if [ $$code = 5 ]; then echo "=== $$name: no tests ran"; fi; \
		if [ $$code != 0 ]; then echo "=== $$name: FAILED (exit $$code)"; fi; \
		return $$code; \
	}; \
	pass2=""; mkdir -p test-artifacts; pass2_log="test-artifacts/pass-2.log"; \
	if $(PY) -m tests.support.services "$(TEST_DATABASE_URL)" "$(TEST_REDIS_URL)"; then \
		run_pass "pass 2: PostgreSQL + Redis" \
			DATABASE_URL="$(TEST_DATABASE_URL)" REDIS_URL="$(TEST_REDIS_URL)" \
			OWLLAYER_CHANNEL_PREFIX="owllayer-test-$$$$" \
			OWLLAYER_TEST_ARTIFACTS="$(CURDIR)/test-artifacts/postgres-redis" \
			> "$$pass2_log" 2>&1 & pass2=$$!; \
		echo "=== pass 2 runs beside pass 1; its output follows pass 1's"; \
	elif [ "$${CI:-}" = true ]; then \
		echo "=== pass 2: PostgreSQL and Redis must answer in CI: FAILED"; status=1; \
	else \
		echo "=== pass 2: skipped: PostgreSQL and Redis do not both answer" \
			"(start them, or see .ci/run)"; \
	fi; \
	run_pass "pass 1: SQLite + in-memory channel layer" -u DATABASE_URL -u REDIS_URL \
		OWLLAYER_TEST_ARTIFACTS="$(CURDIR)/test-artifacts/embedded" || status=1; \
	if [ -n "$$pass2" ]; then \
		tail -n +1 -f --pid="$$pass2" "$$pass2_log"; \
		wait "$$pass2" || status=1; \
	fi; \
	exit $$status

# The benchmark's two-process line puts Debian's nginx in front (run by the
# benchmark itself, on 127.0.0.1, from its scratch directory; never as a service).
nginx:
	@if command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; then \
		true; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian nginx"; \
		apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx; \
	else \
		echo "note: nginx is missing and we are not root;" \
			"the two-process line will fail (as root: apt-get install nginx)"; \
	fi

bench: setup nginx
	$(PY) -m bench --backend both --postgres "$(BENCH_POSTGRES)" --redis "$(BENCH_REDIS)" $(BENCH_ARGS)

# Outside `make test`: each mutant reruns the tests that reach the mutated
# function, on the embedded database. Results stay in mutants/ (`mutmut
# results`, `mutmut show NAME`); a survivor is a promise no test pins.
mutate: setup
	@set -uo pipefail; rm -rf mutants; \
	env -u DATABASE_URL -u REDIS_URL $(VENV)/bin/mutmut run $(MUTANTS); status=$$?; \
	$(VENV)/bin/mutmut results | grep -v ': not checked' || true; \
	exit $$status

# The widget's files changed (tests/widget says so): freeze the current
# release under widget/releases/<release>/, where it stays served, and make
# the sources release $(RELEASE), as recorded in widget/releases/manifest.json.
RELEASE ?=
widget-release: | $(PY)
	@if [ -z "$(RELEASE)" ]; then echo "usage: make widget-release RELEASE=x.y.z" >&2; exit 2; fi
	$(PY) -m widget.releases "$(RELEASE)"

# ruff.toml chooses the rules; mypy.ini names the modules type-checked;
# vulture reports code nothing reads (every kind it finds: 60% is its lowest
# confidence), over the product; tools/vulture_allow.py names what only
# Django, Channels, pydantic, the templates or the tests read, and the
# decorators below register what they decorate.
# (`make test` runs the same line itself rather than a sub-make, so that
# `make -n test` only prints what it would do.)
VULTURE := $(VENV)/bin/vulture agent aitp aitp_client approvals bench connection console demo llm operators owllayer_site widget \
	runtime speech tenants tools/vulture_allow.py --exclude '*/migrations/*' --min-confidence 60 \
	--ignore-decorators '@admin.display,@admin.action,@admin.register,@register.filter,@model_validator,@register_python_tool'
LINT := $(VENV)/bin/ruff check . && $(VENV)/bin/mypy && $(VULTURE)

lint: $(DEV_STAMP) lint-only

lint-only:
	$(LINT)

clean:
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	rm -rf .pytest_cache staticfiles test-db.sqlite3* test-artifacts mutants

# The local database and the demo key and sign-ins go together: a new database needs new ones.
distclean: clean
	rm -rf $(VENV) db.sqlite3 .demo-key .demo-logins
