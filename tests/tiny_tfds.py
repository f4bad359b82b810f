"""Two tiny TFDS translation datasets, de-en and fr-en, that tests build in array_record format (`build`)."""

import tensorflow_datasets as tfds


class _TinyTranslate(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  VERSION = tfds.core.Version("1.0.0")
  LANG, HELLO = "", ""

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.Translation(languages=[self.LANG, "en"]))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(30), "validation": self._generate_examples(4, "v"),
            "test": self._generate_examples(5, "t")}

  def _generate_examples(self, n, prefix=""):
    for i in range(n):
      yield f"{prefix}{i}", {self.LANG: f"{prefix}{self.HELLO} {i}", "en": f"{prefix}hello {i}"}


class TinyDeEnTranslate(_TinyTranslate):
  LANG, HELLO = "de", "hallo"


class TinyFrEnTranslate(_TinyTranslate):
  LANG, HELLO = "fr", "bonjour"


def build(data_dir) -> str:
  """Writes both datasets under `data_dir`; returns the data.source that joins them."""
  for builder in (TinyDeEnTranslate, TinyFrEnTranslate):
    builder(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
  return "tfds:tiny_de_en_translate+tfds:tiny_fr_en_translate"
