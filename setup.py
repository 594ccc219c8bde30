"""Builds pyserve._engine with CMake (the C++ engine in csrc/) and installs the pyserve package."""
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class CMakeExtension(Extension):
    def __init__(self, name: str, source_dir: str = "."):
        super().__init__(name, sources=[])
        self.source_dir = str(Path(source_dir).resolve())


class CMakeBuild(build_ext):
    def build_extension(self, ext: CMakeExtension) -> None:
        import pybind11

        out_dir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        build_type = os.environ.get("PYSERVE_BUILD_TYPE", "Release")
        config = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DCMAKE_BUILD_TYPE={build_type}",
        ]
        if os.environ.get("PYSERVE_SANITIZE"):
            config.append(f"-DPYSERVE_SANITIZE={os.environ['PYSERVE_SANITIZE']}")
        build_dir = Path(self.build_temp).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cmake", ext.source_dir, *config], cwd=build_dir, check=True)
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", ".", "--parallel", jobs], cwd=build_dir, check=True)


setup(ext_modules=[CMakeExtension("pyserve._engine")], cmdclass={"build_ext": CMakeBuild})
