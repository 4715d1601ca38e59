"""Shared test setup: the lab fixtures (lab, clean_lab, lab_factory) come from lab/testing.py."""

pytest_plugins = ["lab.testing"]
