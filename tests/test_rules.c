/*
** test_rules.c — docs/numerics.md: quantization rule sets.  Good files parse with
** defaults for what is missing; each bad file in tests/data/rules fails
** with MOE8_ERR_PARSE (or IO) and a message naming the field, its JSON path
** and its line:column.
*/
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_path[1024];

static const char *data(const char *name) {
  const char *dir = getenv("MOE8_TEST_DATA");
  snprintf(g_path, sizeof g_path, "%s/rules/%s", dir ? dir : "tests/data", name);
  return g_path;
}

static void test_full_rule_set(void **state) {
  (void)state;
  moe8_rules *rs = NULL;
  assert_int_equal(moe8_rules_load(data("good_full.json"), &rs), MOE8_OK);
  assert_int_equal(moe8_rules_count(rs), 2);
  assert_true(moe8_rules_quantize_before_ep_all_gather(rs));
  const moe8_rule *r = moe8_rules_match(rs, "model.layers.3.mlp.experts");
  assert_non_null(r);
  assert_ptr_equal(r, moe8_rules_at(rs, 0)); /* the first match wins */
  assert_int_equal(r->weight_qtype, MOE8_DTYPE_F8E4M3);
  assert_int_equal(r->act_qtype, MOE8_DTYPE_F8E4M3);
  assert_int_equal(r->bwd_qtype, MOE8_DTYPE_F8E5M2);
  assert_int_equal(r->tile_size, 128);
  assert_true(r->act_clip == 0.9f);
  assert_true(r->weight_clip == 1.0f);
  moe8_quant_spec w, a;
  assert_true(moe8_rule_weight_spec(r, &w));
  assert_int_equal(w.gran, MOE8_GRAN_CHANNEL_TILE);
  assert_true(moe8_rule_act_spec(r, &a));
  assert_int_equal(a.gran, MOE8_GRAN_ROW_TILE);
  const moe8_rule *r2 = moe8_rules_match(rs, "attention");
  assert_ptr_equal(r2, moe8_rules_at(rs, 1));
  assert_int_equal(r2->weight_qtype, MOE8_DTYPE_I8);
  assert_true(r2->weight_pow2);
  assert_int_equal(r2->act_qtype, MOE8_DTYPE_NONE);
  assert_false(moe8_rule_act_spec(r2, &a));
  moe8_rules_destroy(rs);
  moe8_rules_destroy(NULL);
}

static void test_minimal_rule(void **state) {
  (void)state;
  moe8_rules *rs = NULL;
  assert_int_equal(moe8_rules_load(data("good_minimal.json"), &rs), MOE8_OK);
  const moe8_rule *r = moe8_rules_match(rs, "layers.0.mlp.experts");
  assert_non_null(r);
  assert_int_equal(r->weight_qtype, MOE8_DTYPE_I8);
  assert_int_equal(r->act_qtype, MOE8_DTYPE_NONE);
  assert_int_equal(r->bwd_qtype, MOE8_DTYPE_NONE);
  assert_int_equal(r->tile_size, 0);
  assert_false(moe8_rules_quantize_before_ep_all_gather(rs));
  moe8_quant_spec w;
  assert_true(moe8_rule_weight_spec(r, &w));
  assert_int_equal(w.gran, MOE8_GRAN_CHANNEL);
  assert_null(moe8_rules_match(rs, "attention"));
  moe8_rules_destroy(rs);
  /* From memory too. */
  const char *txt = "{\"rules\": []}";
  assert_int_equal(moe8_rules_parse(txt, strlen(txt), "inline", &rs), MOE8_OK);
  assert_int_equal(moe8_rules_count(rs), 0);
  assert_null(moe8_rules_match(rs, "experts"));
  moe8_rules_destroy(rs);
}

static void test_bad_files(void **state) {
  (void)state;
  static const struct { const char *file; const char *needles[3]; } cases[] = {
    {"bad_qtype.json",            {"bad_qtype.json:2:19", "rules[0].weight_qtype", "float8_e4m4"}},
    {"bad_field.json",            {"bad_field.json:3:3", "rules[0].tile_sise", "unknown field"}},
    {"bad_calib.json",            {"rules[0].act_calibration_method", "minmax", "bad_calib.json:1:"}},
    {"bad_syntax.json",           {"bad_syntax.json:1:", "malformed JSON", NULL}},
    {"bad_no_path.json",          {"rules[0]", "module_path", NULL}},
    {"bad_regex.json",            {"rules[0].module_path", "invalid regex", "(experts"}},
    {"bad_tile.json",             {"rules[0].tile_size", "positive integer", NULL}},
    {"bad_rules_not_array.json",  {"rules", "must be an array", NULL}},
    {"bad_top_field.json",        {"rule", "unknown field", "bad_top_field.json:1:2"}},
    {"bad_bool.json",             {"quantize_before_ep_all_gather", "true or false", NULL}},
    {"bad_trailing.json",         {"trailing", "bad_trailing.json:1:", NULL}},
    {"bad_empty.json",            {"malformed JSON", NULL, NULL}},
    {"bad_second_rule.json",      {"rules[1].bwd_qtype", "float16", "bad_second_rule.json:2:"}},
    {"bad_duplicate.json",        {"rules[0].module_path", "duplicate field", NULL}},
    {"bad_regex_stacked.json",    {"rules[0].module_path", "stacked repetition", NULL}},
    {"bad_regex_perl_digit.json", {"rules[0].module_path", "not POSIX", "[0-9]"}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    moe8_rules *rs = (moe8_rules *)0x1;
    const moe8_status st = moe8_rules_load(data(cases[i].file), &rs);
    if (st != MOE8_ERR_PARSE) TU_FAIL("%s: status %s, want parse error", cases[i].file, moe8_status_str(st));
    assert_null(rs);
    for (int j = 0; j < 3 && cases[i].needles[j]; j++)
      if (!strstr(moe8_last_error(), cases[i].needles[j]))
        TU_FAIL("%s: message \"%s\" lacks \"%s\"", cases[i].file, moe8_last_error(), cases[i].needles[j]);
  }
  moe8_rules *rs = NULL;
  assert_int_equal(moe8_rules_load(data("no_such_file.json"), &rs), MOE8_ERR_IO);
  assert_non_null(strstr(moe8_last_error(), "no_such_file.json"));
  assert_int_equal(moe8_rules_parse(NULL, 0, "x", &rs), MOE8_ERR_INVALID_ARG);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_full_rule_set),
    cmocka_unit_test(test_minimal_rule),
    cmocka_unit_test(test_bad_files),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
