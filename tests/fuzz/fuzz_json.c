/*
** fuzz_json.c — libFuzzer target: the rule-set parser and the Hugging Face
** config parser on arbitrary text.  On accept, rule lookups must work.
*/
#include "moe8.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  moe8_rules *r = NULL;
  if (moe8_rules_parse((const char *)data, size, "fuzz", &r) == MOE8_OK) {
    (void)moe8_rules_match(r, "model.layers.0.mlp.experts");
    for (size_t i = 0; i < moe8_rules_count(r); i++) {
      moe8_quant_spec s;
      (void)moe8_rule_weight_spec(moe8_rules_at(r, i), &s);
      (void)moe8_rule_act_spec(moe8_rules_at(r, i), &s);
    }
    moe8_rules_destroy(r);
  }
  moe8_hf_config c;
  (void)moe8_hf_config_parse((const char *)data, size, "fuzz", &c);
  return 0;
}
