"""``perfsuite init``: the files a project needs to measure and check its own engine with perfsuite."""

from perfsuite.scaffold.init import InitError, planned_files, write_project

__all__ = ["InitError", "planned_files", "write_project"]
