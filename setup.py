"""The one compiled part: region JPEG decoding for the data loader (src/deeppod/runtime/_jpeg.c),
against the system's libjpeg-turbo (Debian: libjpeg62-turbo-dev). Optional: without the
headers the build says so and the loader decodes with Pillow instead."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any compiler or header failure
            print(f"deeppod: region JPEG decoding not built ({exc}); the loader uses Pillow. "
                  "Install libjpeg-turbo's headers (apt install libjpeg62-turbo-dev) and reinstall for it.")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            print(f"deeppod: {ext.name} not built ({exc}); the loader uses Pillow")


setup(ext_modules=[Extension("deeppod.runtime._jpeg", ["src/deeppod/runtime/_jpeg.c"], libraries=["jpeg"],
                             extra_compile_args=["-O2"], optional=True)],
      cmdclass={"build_ext": OptionalBuildExt})
