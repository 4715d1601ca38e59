"""The lab fixtures (lab, clean_lab, lab_factory: lab/testing.py) for the tests of the lab and of the collection
against in-process lab servers. tests/unit does not load them (tests/unit/test_unit_tests_need_no_lab.py)."""
from lab.testing import clean_lab, lab, lab_factory  # noqa: F401  pylint: disable=unused-import
