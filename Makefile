# llmgw.fleet: every target makes what it needs, from nothing, on a fresh Debian 12 machine (as root).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
COLLECTIONS := $(CURDIR)/.build/collections
SANITY_ROOT := $(CURDIR)/.build/sanity/ansible_collections/llmgw/fleet
export ANSIBLE_COLLECTIONS_PATH := $(COLLECTIONS)
export PYTHONPATH := $(CURDIR)/tests/lab
LAB := $(PY) -m pve_lab

.PHONY: help venv system-deps collection demo test lint sanity units docs molecule lab-up lab-down lab-status shell bench faults fleet-scale clean

help:
	@echo "make demo     - bring the lab up and run the main job on it"
	@echo "make test     - the whole suite (lint, sanity, units, docs, lab, end-to-end), with a time summary"
	@echo "make lint | sanity | units | docs - one quality gate (units: ansible-test units; docs: antsibull-docs, ansible-doc)"
	@echo "make bench    - figures that show the collection is worth it (make bench QUICK=1 for a smoke run)"
	@echo "make faults   - the heavy rows make test leaves out: nodes lost, powered off and partitioned under load, the controller killed mid-run, Proxmox API faults across add_node, 16 add_node runs at once, an engine roll and a drain under load, an engine roll failing mid-way, a disk without room for the model, a QEMU guest boot"
	@echo "make fleet-scale - the fleet-run test at 16 nodes on 2 fabrics (make test runs it at 4; about 10 minutes)"
	@echo "make lab-up | lab-down | lab-status"
	@echo "make shell    - a shell where the commands of README and docs work as typed (.venv/bin on PATH)"

$(VENV)/.stamp: requirements/controller.txt requirements/test.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/test.txt
	touch $@

venv: $(VENV)/.stamp

.build/system-deps.stamp: tests/lab/apt-packages.txt
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$(grep -v '^#' tests/lab/apt-packages.txt) >/dev/null
	mkdir -p .build && touch $@

system-deps: .build/system-deps.stamp

collection:
	@mkdir -p $(COLLECTIONS)/ansible_collections/llmgw
	@ln -sfn ../../../.. $(COLLECTIONS)/ansible_collections/llmgw/fleet

# Up, with what the lab inventory names: the llama.cpp build and the real small model (each cached per machine).
lab-up: venv system-deps collection
	$(LAB) up
	$(PY) tests/lab/engine/build.py
	$(PY) tests/lab/engine/real_model.py

lab-down: venv
	$(LAB) down

lab-status: venv
	$(LAB) status

# ansible.cfg at the root points Ansible at the collection; this puts the venv's ansible-playbook on PATH.
shell: venv collection
	@echo "llmgw.fleet shell: ansible-playbook, ansible-inventory and bin/fleet as the docs type them; 'exit' leaves"
	@cd $(CURDIR) && PATH=$(CURDIR)/$(VENV)/bin:$$PATH VIRTUAL_ENV=$(CURDIR)/$(VENV) $${SHELL:-/bin/bash} -i

demo: venv system-deps collection
	$(PY) tests/demo.py

test: venv system-deps collection
	$(PY) tests/suite.py

lint: venv collection
	$(PY) tests/suite.py --only lint

sanity: venv
	$(PY) tests/suite.py --only sanity

units: venv collection
	$(PY) tests/suite.py --only units

docs: venv collection
	$(PY) tests/suite.py --only docs

molecule: venv collection
	$(PY) tests/suite.py --only molecule

bench: venv system-deps collection
	$(PY) tests/bench/run.py $(if $(QUICK),--quick,)

faults: venv system-deps collection
	$(PY) tests/suite.py --only faults

fleet-scale: venv system-deps collection
	LLMGW_FLEET_NODES=16 $(PY) -m pytest -p no:cacheprovider -ra tests/e2e/test_fleet_run.py

clean: lab-down
	rm -rf .build tests/output
