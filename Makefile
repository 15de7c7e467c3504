# pileshuffle: every target sets up what it needs in .venv (Python 3.10+ and pip from PyPI).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Dataflow flex template (see README "Run on Dataflow")
PROJECT ?= my-project
REGION  ?= us-central1
BUCKET  ?= gs://my-bucket
IMAGE   ?= $(REGION)-docker.pkg.dev/$(PROJECT)/pileshuffle/pileshuffle:latest
TEMPLATE := $(BUCKET)/templates/pileshuffle.json
INPUT   ?= $(BUCKET)/data/train-*.tfrecord
OUTPUT  ?= $(BUCKET)/shuffled/train

DEMO_DIR ?= demo-data

.PHONY: install demo test bench metadata template-build template-run clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## demo: generate ~200 MB of sample TFRecords, shuffle them with the default (local) runner, verify.
demo: $(STAMP)
	rm -rf $(DEMO_DIR)/shuffled
	$(BIN)/pileshuffle generate --format tfrecord --output_dir $(DEMO_DIR)/input --records 200000 --files 8 --record_bytes 1000 > /dev/null
	$(BIN)/pileshuffle run --input '$(DEMO_DIR)/input/*.tfrecord' --output $(DEMO_DIR)/shuffled/train --seed 1
	$(BIN)/pileshuffle verify --input '$(DEMO_DIR)/input/*.tfrecord' --output $(DEMO_DIR)/shuffled/train

## test: the whole suite (real pipelines on generated data).
test: $(STAMP)
	$(BIN)/python -m pytest -q tests

## bench: the benchmark table (see bench/README.md); SCALE=10 for the 10 GB run.
bench: $(STAMP)
	$(BIN)/python bench/run.py $(if $(SCALE),--scale $(SCALE),)

## metadata: regenerate templates/metadata.json from pileshuffle/options.py.
metadata: $(STAMP)
	$(BIN)/pileshuffle metadata > templates/metadata.json

template-build:
	gcloud builds submit --tag $(IMAGE) --project $(PROJECT) .
	gcloud dataflow flex-template build $(TEMPLATE) --image $(IMAGE) --sdk-language PYTHON \
	  --metadata-file templates/metadata.json --project $(PROJECT)

template-run:
	gcloud dataflow flex-template run "pileshuffle-$$(date +%Y%m%d-%H%M%S)" --template-file-gcs-location $(TEMPLATE) \
	  --region $(REGION) --project $(PROJECT) \
	  --parameters input='$(INPUT)',output=$(OUTPUT),seed=1,intermediate=shuffle,temp_location=$(BUCKET)/tmp

clean:
	rm -rf $(DEMO_DIR) bench/.out .pytest_cache
