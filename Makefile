# pileshuffle: every target sets up what it needs in .venv (Python 3.10+ and pip from PyPI).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The shuffle bench's peers (DuckDB, Polars, Ray Data, Hugging Face datasets) in a venv of their own.
PEERS_VENV  ?= bench/.peers-venv
PEERS_STAMP := $(PEERS_VENV)/.installed

# Dataflow flex template (see docs/dataflow.md). BUCKET is a gs:// URL; REPOSITORY an
# Artifact Registry Docker repository in REGION. Commas in INPUT are fine (comma-separated patterns).
# An empty MAX_PILE_BYTES keeps the pipeline's default. EXTRA_PARAMETERS: more name=value pairs,
# separated by ~ (e.g. number_of_worker_harness_threads=2).
PROJECT    ?= my-project
REGION     ?= us-central1
BUCKET     ?= gs://my-bucket
REPOSITORY ?= pileshuffle
TAG        ?= latest
IMAGE      ?= $(REGION)-docker.pkg.dev/$(PROJECT)/$(REPOSITORY)/pileshuffle:$(TAG)
TEMPLATE   ?= $(BUCKET)/templates/pileshuffle.json
INPUT      ?= $(BUCKET)/data/train-*.tfrecord
OUTPUT     ?= $(BUCKET)/shuffled/train
FORMAT     ?= tfrecord
SEED       ?= 0
NUM_PILES  ?= auto
MAX_PILE_BYTES ?=
INTERMEDIATE   ?= shuffle
MACHINE_TYPE   ?= n2-highmem-4
MAX_WORKERS    ?= 20
EXTRA_PARAMETERS ?=

DEMO_DIR ?= demo-data

.PHONY: install peers demo lint test bench metadata api samples template-build template-run clean

$(STAMP): setup.py templates/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --constraint templates/constraints.txt -e '.[pipeline,test]'
	touch $(STAMP)

install: $(STAMP)

$(PEERS_STAMP): bench/peers-requirements.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/pip install --quiet -r bench/peers-requirements.txt
	touch $(PEERS_STAMP)

## peers: the shuffle bench's peers in their own venv, bench/.peers-venv (bench/peers-requirements.txt).
peers: $(PEERS_STAMP)

## demo: generate ~200 MB of sample TFRecords, shuffle them with the default (local) runner, verify, report its quality.
demo: $(STAMP)
	rm -rf $(DEMO_DIR)/shuffled
	$(BIN)/pileshuffle generate --format tfrecord --output_dir $(DEMO_DIR)/input --records 200000 --files 8 --record_bytes 1000 > /dev/null
	$(BIN)/pileshuffle run --input '$(DEMO_DIR)/input/*.tfrecord' --output $(DEMO_DIR)/shuffled/train --seed 1
	$(BIN)/pileshuffle verify --input '$(DEMO_DIR)/input/*.tfrecord' --output $(DEMO_DIR)/shuffled/train
	$(BIN)/pileshuffle quality --input '$(DEMO_DIR)/input/*.tfrecord' --output $(DEMO_DIR)/shuffled/train --report $(DEMO_DIR)/report --label_bytes 6:7 --compare

## lint: the house style (ruff.toml): formatted as `ruff format` writes it, and `ruff check` finds nothing.
lint: $(STAMP)
	$(BIN)/ruff format --check --quiet .
	$(BIN)/ruff check --quiet .

## test: the style (lint), then the whole suite (real pipelines on generated data), one test file per worker: TEST_WORKERS=2 (CI's cores).
## Skips are listed (-rs); a skip not allowed in tests/suite_rules.py, or a missing test dependency, fails the run.
## The package is compiled to bytecode first, as an install leaves it: each command a test starts would compile it again where PYTHONDONTWRITEBYTECODE is set.
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m compileall -q pileshuffle tests
	$(BIN)/python -m pytest -q -rfEs -n $(TEST_WORKERS) --dist loadfile tests

## bench: the benchmark tables (see bench/README.md): the shuffle, CPU seconds per GB against DuckDB, the loader, the pile stores, gs:// on the emulator, a pile from many parts (local, and fetched from a 30 ms emulator), small piles' shards, spilled runs, one large file, --dedup against DuckDB, how fast commands exit, CPU per GB at 10-240 records per part; SCALE=10 for 10 GB.
bench: $(STAMP) $(PEERS_STAMP)
	$(BIN)/python bench/run.py $(if $(SCALE),--scale $(SCALE),)
	$(BIN)/python bench/loader.py $(if $(SCALE),--scale $(SCALE),)
	$(BIN)/python bench/store.py
	$(BIN)/python bench/gcs.py
	$(BIN)/python bench/pile_assembly.py
	$(BIN)/python bench/pass2_fetch.py
	$(BIN)/python bench/small_piles.py
	$(BIN)/python bench/spill_cost.py
	$(BIN)/python bench/memory_budget.py
	$(BIN)/python bench/value_crc_cost.py
	$(BIN)/python bench/run_compression.py
	$(BIN)/python bench/large_file.py
	$(BIN)/python bench/dedup.py $(if $(SCALE),--size $(SCALE)GB --rounds 1,)
	$(BIN)/python bench/exits.py
	$(BIN)/python bench/cpu_per_gb.py
	$(BIN)/python bench/regime_rates.py

## metadata: regenerate templates/metadata.json from pileshuffle/commands/options.py (tests fail when they drift).
metadata: $(STAMP)
	$(BIN)/pileshuffle metadata > templates/metadata.json.tmp
	mv templates/metadata.json.tmp templates/metadata.json

## api: regenerate the list of public names in docs/api.md from each module's __all__ (tests/test_api.py fails when it drifts).
api: $(STAMP)
	$(BIN)/python tests/test_api.py

## samples: rewrite the sample outputs marked in README.md and docs/cli.md by running their commands (docs/samples.py; tests/test_doc_samples.py fails when they drift).
samples: $(STAMP)
	$(BIN)/python docs/samples.py --write

## template-build: build and push the image with Cloud Build, then write the template spec to $(TEMPLATE).
template-build:
	gcloud builds submit --project $(PROJECT) \
	  --config templates/cloudbuild.yaml --substitutions _IMAGE=$(IMAGE) .
	gcloud dataflow flex-template build $(TEMPLATE) --project $(PROJECT) \
	  --image $(IMAGE) --sdk-language PYTHON --metadata-file templates/metadata.json

## template-run: launch a job from the template (returns once the job is submitted).
template-run:
	gcloud dataflow flex-template run "pileshuffle-$$(date +%Y%m%d-%H%M%S)" --project $(PROJECT) --region $(REGION) \
	  --template-file-gcs-location $(TEMPLATE) \
	  --temp-location $(BUCKET)/tmp --staging-location $(BUCKET)/staging \
	  --worker-machine-type $(MACHINE_TYPE) --max-workers $(MAX_WORKERS) \
	  --parameters '^~^input=$(INPUT)~output=$(OUTPUT)~format=$(FORMAT)~seed=$(SEED)~num_piles=$(NUM_PILES)$(if $(MAX_PILE_BYTES),~max_pile_bytes=$(MAX_PILE_BYTES))~intermediate=$(INTERMEDIATE)~sdk_container_image=$(IMAGE)$(if $(EXTRA_PARAMETERS),~$(EXTRA_PARAMETERS))'

clean:
	rm -rf $(DEMO_DIR) bench/.out .pytest_cache
