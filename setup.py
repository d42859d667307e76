"""Only here to put ``bosch_eval_lm_eval_hook.pth`` into site-packages; all metadata is in pyproject.toml.

lm-eval 0.4.13 cannot discover plugins, so a ``.pth`` start-up line imports
``bosch_eval.lm_eval_hook`` (see there). setuptools has no declarative way to install a
file at the top of site-packages, hence this ``build_py`` subclass:

* ``pip install .`` (regular wheel): the file is written to the root of ``build_lib``,
  and everything there becomes the root of the wheel, i.e. of site-packages.
* ``pip install -e .`` (PEP 660, setuptools' ``editable_wheel``): ``build_lib`` is a
  scratch folder that does not go into the editable wheel, so in editable mode the file
  is written to the ``install`` command's ``install_lib``, which ``editable_wheel`` points
  at the unpacked wheel (setuptools >= 64 does so for data/headers/scripts; not a
  documented contract, tests/test_lm_eval_plugin.py checks the installed result).
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_NAME = "bosch_eval_lm_eval_hook.pth"
# A .pth line starting with "import" is executed at interpreter start. The try/except
# keeps start-up silent when bosch_eval was uninstalled but this file lingers.
PTH_LINE = 'import sys; exec("try:\\n import bosch_eval.lm_eval_hook\\nexcept ImportError:\\n pass")\n'


class build_py_with_pth(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            dest_dir = self.get_finalized_command("install").install_lib
        else:
            dest_dir = self.build_lib
        dest = Path(dest_dir, PTH_NAME)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(PTH_LINE, encoding="utf-8")
        self.announce(f"wrote {dest}", level=2)


setup(cmdclass={"build_py": build_py_with_pth})
