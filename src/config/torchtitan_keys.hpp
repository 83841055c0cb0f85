#pragma once
/// @file The TorchTitan compatibility layer of the option registry: every key of TorchTitan
/// v0.2.2's JobConfig (torchtitan/config/job_config.py, all its dataclasses including the nested
/// [training.dataloader], [quantize.linear.float8], ...) with its TorchTitan default and one
/// outcome per value: honoured (meshtrain implements it), notice (accepted; one line says why it
/// has no effect here) or refused (`not implemented yet`, or why the value means nothing here).
/// The table is torchtitan_keys.cpp; the rules that involve more than one key are
/// torchtitan_resolve.cpp; doc/torchtitan-compat.md is rendered from both (torchtitan_compat.hpp).
#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "config/option_registry.hpp"

namespace meshtrain {

/// Adds TorchTitan's keys to `options` (the meshtrain options of build_option_table(), grouped
/// by section): a key meshtrain already has gets its TorchTitan default, outcome text and value
/// verdict; every other key is inserted as a TorchTitan-only option at the end of its section
/// (new sections follow the meshtrain section they belong with). Called once by
/// option_registry(). Throws nothing.
void add_torchtitan_keys(std::vector<Option>& options);

/// Every TorchTitan v0.2.2 key as "section.key", in TorchTitan's order (JobConfig's sections,
/// then each dataclass's fields), plus `[quantize.linear.float8] enable` (see the table). The
/// compat table's rows. Throws nothing.
const std::vector<std::string>& torchtitan_key_names();

/// The keys of the resolved TorchTitan sections that are not TorchTitan's ("section.key", registry
/// order): what meshtrain adds. Throws nothing.
std::vector<std::string> meshtrain_only_key_names();

/// The TorchTitan pass of load_job_config(), run once every key is set. `set_keys` are the keys
/// the deck or the command line set ("section.key"), deck keys in line order then command-line
/// ones. It applies the keys that stand for a meshtrain field under another name
/// ([training] dataset_path → dataset, [debug] seed → [training] seed, [model] tokenizer_path →
/// hf_assets_path; the command line wins over the deck, two deck keys that disagree are
/// refused), runs every set key's Option::verdict and the rules between keys (export_dtype and
/// last_save_model_only, lr_scheduler total_steps and training steps, validation seq_len /
/// local_batch_size, a TorchTitan dataset name that is not a file, async TP without tp or
/// sequence parallelism), and fills cfg.notices and
/// cfg.refusals in `set_keys` order, each line `ORIGIN: [section] key: why`.
/// Throws nothing (refusals are thrown by JobConfig::validate()).
void apply_torchtitan_keys(JobConfig& cfg, const std::vector<std::string>& set_keys);

/// True when `name` is a dataset TorchTitan v0.2.2 registers by name (c4, c4_test, c4_validation,
/// the Flux and VLM image sets), which TorchTitan downloads from the Hugging Face Hub. Throws nothing.
bool is_torchtitan_dataset_name(const std::string& name);

}  // namespace meshtrain
