#pragma once
// One definition per family folder; registry.cpp lists them.
#include "models/registry.h"

namespace qinfer::models {

const Family& qwen3_family();
const Family& qwen3_moe_family();
const Family& qwen3_next_family();
const Family& qwen3_5_family();
const Family& qwen3_5_moe_family();

}  // namespace qinfer::models
