// Shapes, element types, aligned owning buffers and non-owning views.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

namespace rt {

// Logical 4-D NCHW shape. Vectors and matrices use trailing 1s: logits are (n, classes, 1, 1).
// The physical layout of an activation (plain NCHW, blocked nChw8c or nChw16c, ...) belongs to the backend.
struct Shape {
  int64_t n = 1, c = 1, h = 1, w = 1;
  int64_t numel() const { return n * c * h * w; }
  int64_t chw() const { return c * h * w; }
  bool operator==(const Shape&) const = default;
  std::string str() const {
    return "[" + std::to_string(n) + "," + std::to_string(c) + "," + std::to_string(h) + "," +
           std::to_string(w) + "]";
  }
};

// Storage element types. fp32 everywhere on the CPU; the 16-bit types are storage formats for
// the GPU path's activations and weights (fp32 accumulation, fp32 master weights).
enum class DType : uint8_t { f32, bf16, f16 };
struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };
constexpr size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
constexpr const char* dtype_name(DType t) {
  return t == DType::f32 ? "f32" : t == DType::bf16 ? "bf16" : "f16";
}

// Round-to-nearest-even fp32 -> bf16 (NaN kept quiet) and back; used by tests and checkpoints.
inline bf16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}
inline float from_bf16(bf16_t b) {
  uint32_t u = uint32_t(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even fp32 -> IEEE half, as the GPU's __float2half_rn: magnitudes from 65520
// (halfway between the largest half, 65504, and 2^16) up become inf rather than saturating, which
// is what dynamic loss scaling detects as an overflow; below 2^-14 the result is subnormal, below
// 2^-25 zero. NaN stays a quiet NaN of the same sign.
inline f16_t to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return {uint16_t(sign | 0x7e00u)};
  if (a >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};  // >= 65520, inf included
  if (a >= 0x38800000u) {                                    // normal: rebias 127 -> 15
    const uint32_t v = a - 0x38000000u;
    return {uint16_t(sign | ((v + 0x0fffu + ((v >> 13) & 1u)) >> 13))};
  }
  // Subnormal: units of 2^-24. A carry out of the mantissa gives the smallest normal, correctly.
  const int e = int(a >> 23);
  if (e < 102) return {sign};  // below 2^-25
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const int shift = 126 - e;  // 14 .. 24
  const uint32_t k = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  return {uint16_t(sign | (k + (rem > half || (rem == half && (k & 1u)))))};
}
inline float from_f16(f16_t h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16, e = (h.bits >> 10) & 0x1fu,
                 m = h.bits & 0x3ffu;
  uint32_t u;
  if (e == 0x1f) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    u = sign | ((e + 112) << 23) | (m << 13);
  } else {  // zero or subnormal: m * 2^-24, exact in fp32
    const float v = float(m) * 0x1p-24f;
    std::memcpy(&u, &v, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// fp32 values rounded once to the 16-bit types: what a device buffer of that type holds.
inline float bf16_round(float f) { return from_bf16(to_bf16(f)); }
inline float f16_round(float f) { return from_f16(to_f16(f)); }

// Memory other than the host heap (a GPU's), for Buffers a backend's ops read and write. Only
// set-up allocates; copy and zero are for set-up and the rare gradient copy, not per element.
// to_host and from_host are how host code reads and writes memory it may not dereference: they
// are synchronous (ordered after the backend's queued work, done when they return).
class MemorySpace {
 public:
  virtual ~MemorySpace() = default;
  virtual std::string name() const = 0;
  virtual void* allocate(size_t bytes) const = 0;  // zero-filled; throws on failure
  virtual void deallocate(void* p, size_t bytes) const noexcept = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) const = 0;  // both in this space
  virtual void zero(void* p, size_t bytes) const = 0;
  virtual void to_host(void* host_dst, const void* src, size_t bytes) const = 0;
  virtual void from_host(void* dst, const void* host_src, size_t bytes) const = 0;
  // Host code may dereference the pointers (host memory in disguise), once the backend sync()ed.
  virtual bool host_accessible() const = 0;
};

namespace detail {
// Zeroed, 64-byte aligned host memory of `bytes` (a multiple of 64), and its release (nn/host_pages.cc).
void* host_alloc_zeroed(size_t bytes);
void host_free(void* p, size_t bytes) noexcept;
}  // namespace detail

// Owning, zero-initialised array, 64-byte aligned host memory unless given a MemorySpace (then
// element access from the host is allowed only when the space is host accessible; otherwise the
// host goes through to_host / from_host). Movable, not copyable: big buffers are allocated once
// at set-up, never per step.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) { resize(n); }
  // space must outlive the buffer; nullptr is host memory.
  explicit Buffer(const MemorySpace* space) : space_(space) {}
  Buffer(Buffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), space_(o.space_) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      space_ = o.space_;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }

  // Reallocates (contents lost, zeroed) unless the size is unchanged.
  void resize(size_t n) {
    if (n == n_) return;
    release();
    if (n == 0) return;
    size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    if (space_) {
      p_ = static_cast<T*>(space_->allocate(bytes));
      n_ = n;
      return;
    }
    p_ = static_cast<T*>(detail::host_alloc_zeroed(bytes));
    n_ = n;
  }
  void zero() { zero(0, n_); }
  void zero(size_t offset, size_t n) {  // elements [offset, offset + n), in bounds
    if (!n) return;
    if (space_) space_->zero(p_ + offset, n * sizeof(T));
    else std::memset(static_cast<void*>(p_ + offset), 0, n * sizeof(T));
  }
  // Copies the first n elements of src (same memory space) into this buffer.
  void copy_from(const Buffer& src, size_t n) { copy_from(src.p_, n); }
  void copy_from(const T* src, size_t n) {
    if (!n) return;
    if (space_) space_->copy(p_, src, n * sizeof(T));
    else std::memcpy(static_cast<void*>(p_), src, n * sizeof(T));
  }
  // Synchronous copies of elements [offset, offset + n) to and from host memory.
  void to_host(T* host_dst, size_t offset, size_t n) const {
    if (!n) return;
    if (space_) space_->to_host(host_dst, p_ + offset, n * sizeof(T));
    else std::memcpy(static_cast<void*>(host_dst), p_ + offset, n * sizeof(T));
  }
  void from_host(const T* host_src, size_t offset, size_t n) {
    if (!n) return;
    if (space_) space_->from_host(p_ + offset, host_src, n * sizeof(T));
    else std::memcpy(static_cast<void*>(p_ + offset), host_src, n * sizeof(T));
  }
  bool host_accessible() const { return !space_ || space_->host_accessible(); }
  const MemorySpace* space() const { return space_; }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }

 private:
  void release() {
    if (space_ && p_) space_->deallocate(p_, (n_ * sizeof(T) + 63) / 64 * 64);
    else detail::host_free(p_, (n_ * sizeof(T) + 63) / 64 * 64);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
  const MemorySpace* space_ = nullptr;
};

// Non-owning view of a tensor: data pointer and logical shape.
template <class T>
struct View {
  T* data = nullptr;
  Shape shape;
};

}  // namespace rt
