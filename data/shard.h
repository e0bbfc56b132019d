// Packed shard sets: a dataset's encoded images in a few large files, read with one pread per
// image (no per-image open, stat or directory walk) and checked with CRC-32.
//
// A shard set is named by its index file PREFIX.index (text, one field per line):
//
//   ringtrain-shards 1          magic and version
//   split train                 the split packed (informational)
//   samples N                   total records in all shards
//   classes C                   then C lines "class <name>" in label order
//   class <name>
//   shards S                    then S lines "shard <records> <bytes> <file>", file relative to
//   shard <count> <bytes> <file>   the index file's folder, in sample order
//
// Each shard file PREFIX-00000.shard, ... (little-endian):
//
//   offset 0   header (32 bytes)
//              char[8] magic "RTSHARD\0" | u32 version = 1 | u32 count |
//              u64 index_offset | u32 index_crc (CRC-32 of the whole index block) |
//              u32 header_crc (CRC-32 of the 28 bytes before it)
//   offset 32  the records' encoded image bytes back to back, exactly as in the source files
//   index_offset  count entries of 24 bytes:
//              u64 offset | u32 size | i32 label | u32 crc (CRC-32 of the record's bytes) |
//              u32 name_offset (into the names block)
//              then the names block: each record's source path relative to the dataset root,
//              NUL-terminated (for messages only)
//
// Samples are numbered across shards in order; packing a folder keeps the folder's sample order,
// so a shard set yields the same samples (bytes and labels) in the same order as its folder. A
// source file that cannot be read is packed as an empty record, which the loader skips like the
// unreadable file. CRC-32 is zlib's (polynomial 0xEDB88320), so Python's zlib.crc32 checks it.
// Opening checks magic, version and header/index checksums; each record's checksum is checked
// when it is read. A mismatch is storage damage, not a bad image: it is an rt::Error naming the
// shard file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "data/dataset.h"

namespace rt::data {

uint32_t crc32(const void* data, size_t len, uint32_t crc = 0);

// Opens the shard set named by an index file; with expect_split ("train", "val"), one packed from
// another split is an error naming the index (swapped train and val shard sets).
std::unique_ptr<Dataset> open_shards(const std::string& index_path, const std::string& expect_split = "");

struct PackStats {
  int64_t samples = 0, shards = 0, bytes = 0, unreadable = 0;
  std::string index_path;
};

// Packs ds into shards of about shard_bytes each (a shard closes before the record that would
// take it past the limit; one record larger than the limit gets a shard of its own). Record names
// are ds.name(i) with `strip` removed from the front. Files are written under temporary names and
// renamed at the end, the index last, so an interrupted run leaves no index that looks complete.
PackStats pack_shards(const Dataset& ds, const std::string& split, const std::string& prefix,
                      int64_t shard_bytes, const std::string& strip = "");

}  // namespace rt::data
