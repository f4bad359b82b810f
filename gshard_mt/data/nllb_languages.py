"""NLLB-200's language codes, as data: FAIRSEQ_LANGUAGE_CODES in the order of transformers' NllbTokenizer (their
ids follow the SentencePiece pieces in that order), and USUAL_CODES, the NLLB code of each corpus language code that
does not name one by itself (a macrolanguage, a Tatoeba or ISO 639-1 code, or a language NLLB writes in several
scripts: the usual one).
"""

FAIRSEQ_LANGUAGE_CODES = (
  "ace_Arab", "ace_Latn", "acm_Arab", "acq_Arab", "aeb_Arab", "afr_Latn", "ajp_Arab", "aka_Latn", "amh_Ethi",
  "apc_Arab", "arb_Arab", "ars_Arab", "ary_Arab", "arz_Arab", "asm_Beng", "ast_Latn", "awa_Deva", "ayr_Latn",
  "azb_Arab", "azj_Latn", "bak_Cyrl", "bam_Latn", "ban_Latn", "bel_Cyrl", "bem_Latn", "ben_Beng", "bho_Deva",
  "bjn_Arab", "bjn_Latn", "bod_Tibt", "bos_Latn", "bug_Latn", "bul_Cyrl", "cat_Latn", "ceb_Latn", "ces_Latn",
  "cjk_Latn", "ckb_Arab", "crh_Latn", "cym_Latn", "dan_Latn", "deu_Latn", "dik_Latn", "dyu_Latn", "dzo_Tibt",
  "ell_Grek", "eng_Latn", "epo_Latn", "est_Latn", "eus_Latn", "ewe_Latn", "fao_Latn", "pes_Arab", "fij_Latn",
  "fin_Latn", "fon_Latn", "fra_Latn", "fur_Latn", "fuv_Latn", "gla_Latn", "gle_Latn", "glg_Latn", "grn_Latn",
  "guj_Gujr", "hat_Latn", "hau_Latn", "heb_Hebr", "hin_Deva", "hne_Deva", "hrv_Latn", "hun_Latn", "hye_Armn",
  "ibo_Latn", "ilo_Latn", "ind_Latn", "isl_Latn", "ita_Latn", "jav_Latn", "jpn_Jpan", "kab_Latn", "kac_Latn",
  "kam_Latn", "kan_Knda", "kas_Arab", "kas_Deva", "kat_Geor", "knc_Arab", "knc_Latn", "kaz_Cyrl", "kbp_Latn",
  "kea_Latn", "khm_Khmr", "kik_Latn", "kin_Latn", "kir_Cyrl", "kmb_Latn", "kon_Latn", "kor_Hang", "kmr_Latn",
  "lao_Laoo", "lvs_Latn", "lij_Latn", "lim_Latn", "lin_Latn", "lit_Latn", "lmo_Latn", "ltg_Latn", "ltz_Latn",
  "lua_Latn", "lug_Latn", "luo_Latn", "lus_Latn", "mag_Deva", "mai_Deva", "mal_Mlym", "mar_Deva", "min_Latn",
  "mkd_Cyrl", "plt_Latn", "mlt_Latn", "mni_Beng", "khk_Cyrl", "mos_Latn", "mri_Latn", "zsm_Latn", "mya_Mymr",
  "nld_Latn", "nno_Latn", "nob_Latn", "npi_Deva", "nso_Latn", "nus_Latn", "nya_Latn", "oci_Latn", "gaz_Latn",
  "ory_Orya", "pag_Latn", "pan_Guru", "pap_Latn", "pol_Latn", "por_Latn", "prs_Arab", "pbt_Arab", "quy_Latn",
  "ron_Latn", "run_Latn", "rus_Cyrl", "sag_Latn", "san_Deva", "sat_Beng", "scn_Latn", "shn_Mymr", "sin_Sinh",
  "slk_Latn", "slv_Latn", "smo_Latn", "sna_Latn", "snd_Arab", "som_Latn", "sot_Latn", "spa_Latn", "als_Latn",
  "srd_Latn", "srp_Cyrl", "ssw_Latn", "sun_Latn", "swe_Latn", "swh_Latn", "szl_Latn", "tam_Taml", "tat_Cyrl",
  "tel_Telu", "tgk_Cyrl", "tgl_Latn", "tha_Thai", "tir_Ethi", "taq_Latn", "taq_Tfng", "tpi_Latn", "tsn_Latn",
  "tso_Latn", "tuk_Latn", "tum_Latn", "tur_Latn", "twi_Latn", "tzm_Tfng", "uig_Arab", "ukr_Cyrl", "umb_Latn",
  "urd_Arab", "uzn_Latn", "vec_Latn", "vie_Latn", "war_Latn", "wol_Latn", "xho_Latn", "ydd_Hebr", "yor_Latn",
  "yue_Hant", "zho_Hans", "zho_Hant", "zul_Latn",
)

USUAL_CODES = {
  # several scripts: the usual one
  "ace": "ace_Latn", "bjn": "bjn_Latn", "kas": "kas_Arab", "knc": "knc_Latn", "taq": "taq_Latn", "zho": "zho_Hans",
  # macrolanguages and Tatoeba's codes: the variety NLLB has
  "ara": "arb_Arab", "aze": "azj_Latn", "cmn": "zho_Hans", "fas": "pes_Arab", "kur": "kmr_Latn", "lav": "lvs_Latn",
  "mon": "khk_Cyrl", "msa": "zsm_Latn", "nep": "npi_Deva", "ori": "ory_Orya", "orm": "gaz_Latn", "mlg": "plt_Latn",
  "pus": "pbt_Arab", "sqi": "als_Latn", "swa": "swh_Latn", "uzb": "uzn_Latn", "yid": "ydd_Hebr",
  "nor": "nob_Latn", "que": "quy_Latn",
  # ISO 639-1 codes (TFDS's WMT datasets)
  "cs": "ces_Latn", "de": "deu_Latn", "en": "eng_Latn", "es": "spa_Latn", "et": "est_Latn", "fi": "fin_Latn",
  "fr": "fra_Latn", "gu": "guj_Gujr", "hi": "hin_Deva", "it": "ita_Latn", "ja": "jpn_Jpan", "kk": "kaz_Cyrl",
  "km": "khm_Khmr", "lt": "lit_Latn", "lv": "lvs_Latn", "pl": "pol_Latn", "ps": "pbt_Arab", "ro": "ron_Latn",
  "ru": "rus_Cyrl", "ta": "tam_Taml", "tr": "tur_Latn", "zh": "zho_Hans",
}
