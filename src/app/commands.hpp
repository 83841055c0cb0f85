#pragma once
/// @file The subcommands of the `meshtrain` binary, one file each (DESIGN.md, app/).
/// Each takes the arguments after its own name and returns the process exit status.

namespace meshtrain::app {

/// `meshtrain train --deck FILE [--section.key=value ...]` (train_cmd.cpp). Needs MPI.
int cmd_train(int argc, char** argv);
/// `meshtrain data prepare --input PATH... --output FILE.h5 [--vocab-size N | --tokenizer FILE.model]`
/// (data_cmd.cpp). Serial; no MPI launch needed.
int cmd_data(int argc, char** argv);
/// `meshtrain deck reference [--markdown]` and `meshtrain deck check --deck FILE --world-size N`
/// (deck_cmd.cpp). Serial.
int cmd_deck(int argc, char** argv);
/// `meshtrain layout --deck FILE --world-size N [--topology FILE] [--csv FILE]` (layout_cmd.cpp):
/// the rank layout report for N simulated ranks, no MPI launch. Serial.
int cmd_layout(int argc, char** argv);
/// `meshtrain model info --name NAME --flavor FLAVOR [--seq-len T]` (model_cmd.cpp): parameter
/// count and FLOPs per token of any flavor, large ones included. Serial.
int cmd_model(int argc, char** argv);

/// `meshtrain ckpt inspect FILE` (ckpt_cmd.cpp): a checkpoint's tree, shapes, dtypes, train
/// state, writer layout and checksum verdict; exit 2 when a checksum fails. Serial.
int cmd_ckpt(int argc, char** argv);

/// `meshtrain pp schedule --schedule NAME --pp N --microbatches M [--stages-per-rank V |
/// --layers L --layers-per-stage K]` or `meshtrain pp schedule --csv FILE [--stages-per-rank V]
/// [--placement loop|v]` (pp_cmd.cpp): a pipeline schedule's unit-cost timeline,
/// bubble fraction against the papers' formula, and peak in-flight micro-batches. Serial.
int cmd_pp(int argc, char** argv);

/// `meshtrain plan --deck FILE --gpus N [--hardware NAME|FILE] [--top K] [--fixed KEYS]
/// [--write-deck OUT] [--json OUT] [--plot OUT.png]` (plan_cmd.cpp): every valid layout of the
/// deck's model and batch on N devices with its predicted memory and speed. Serial.
int cmd_plan(int argc, char** argv);

}  // namespace meshtrain::app
