"""Package discovery and the ``bosch_eval_lm_eval_hook.pth`` start-up file; all metadata is in pyproject.toml.

Packages: ``bosch_eval/`` and the card's top-level folders ``model_adapters/``,
``search/`` and ``tasks/`` install under the ``bosch_eval`` namespace
(``bosch_eval.search`` ...), so nothing generic such as ``search`` lands in
site-packages. setuptools' declarative ``packages.find`` cannot add a name prefix, so
the packages under each folder are found here (every folder with an ``__init__.py``);
a hand-kept list once left ``bosch_eval.attention.kernels`` out of the wheel.

Start-up file: lm-eval 0.4.13 cannot discover plugins, so a ``.pth`` start-up line imports
``bosch_eval.model_adapters.lm_eval_hook`` (see there). setuptools has no declarative way to install a
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

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

PTH_NAME = "bosch_eval_lm_eval_hook.pth"
# A .pth line starting with "import" is executed at interpreter start. The try/except
# keeps start-up silent when bosch_eval was uninstalled but this file lingers.
PTH_LINE = 'import sys; exec("try:\\n import bosch_eval.model_adapters.lm_eval_hook\\nexcept ImportError:\\n pass")\n'


# Installed package name -> source folder, relative to this file.
PACKAGE_DIRS = {
    "bosch_eval": "bosch_eval",
    "bosch_eval.model_adapters": "model_adapters",
    "bosch_eval.search": "search",
    "bosch_eval.tasks": "tasks",
}


def discover_packages(package_dirs: dict[str, str]) -> list[str]:
    """Every package under each folder, named under its installed prefix."""
    root = Path(__file__).resolve().parent
    packages = []
    for name, folder in package_dirs.items():
        packages.append(name)
        packages += [f"{name}.{sub}" for sub in find_packages(str(root / folder))]
    return sorted(packages)


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


setup(
    packages=discover_packages(PACKAGE_DIRS),
    package_dir=PACKAGE_DIRS,
    cmdclass={"build_py": build_py_with_pth},
)
