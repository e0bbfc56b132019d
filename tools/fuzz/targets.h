// The fuzzed input readers as plain entry functions, shared by the libFuzzer programs
// (tools/fuzz/fuzz_*.cc) and the regression test over saved inputs (tests/test_fuzz_regressions.cc).
//
// Each takes one input's bytes and returns true when the reader accepted it, false when it refused
// it with an rt::Error (the expected outcome for bad input). Anything else is a bug: another
// exception, or a broken invariant (an std::logic_error), propagates; the sanitizers catch the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rt::fuzz {

// YAML text up to the first NUL, then NUL-separated "key=value" overrides: config_parse, then
// config_validate; a valid config must print (config_to_yaml) and parse back to the same text.
bool fuzz_config(const uint8_t* data, size_t size);

// A list file's text: open_list and list_max_label; every sample's name and label.
bool fuzz_list(const uint8_t* data, size_t size);

// A shard set: byte 0 is a mode (bit 0 clear: the harness rewrites each shard's header and index
// CRC-32 so mutations get past them), then parts separated by "\n%%%%\n": the index text (file
// fz.index), then shard files fz-00000.shard, fz-00001.shard, ... Opens the set and reads every
// record and its name.
bool fuzz_shard(const uint8_t* data, size_t size);

// Byte 0: flags (bit 0 train, bit 1 flip, bit 2 also HWC bytes, bit 3 no floats, bits 4-5 the crop
// scale range, bits 6-7 data.auto_augment's policy, with random erasing at 0.5 unless none), byte 1:
// output size - 1 (mod 64), byte 2: the augmentation seed; the rest is the encoded image (JPEG,
// PNG, or anything). Runs image_dims, jpeg_complete and decode_augment; true when it decoded.
bool fuzz_image(const uint8_t* data, size_t size);

// A checkpoint file, after one mode byte (bit 0 clear: the harness sets the header's payload
// length and FNV-1a checksum to match the bytes): checkpoint_read, then checkpoint_check_model
// against another model.
bool fuzz_checkpoint(const uint8_t* data, size_t size);

// The targets by name ("config", "list", "shard", "image", "checkpoint").
using FuzzEntry = bool (*)(const uint8_t*, size_t);
FuzzEntry fuzz_entry(const std::string& name);
std::vector<std::string> fuzz_target_names();

}  // namespace rt::fuzz
