// User-space switch for the emulated cluster when links need latency (this kernel has no netem):
// one TUN device per host, every IPv4 packet paced at the link rate on the sender's uplink and the
// receiver's downlink, then held for the one-way latency before delivery.
//
// Usage (tools/cluster/up.sh starts it inside the switch namespace and moves the devices):
//   netem_relay --hosts N --rate BITS_PER_S --latency-us L [--subnet 10.77.0] [--dev rtct]
//               [--queue-ms 20]
// Creates TUN devices <dev>0 … <dev>N-1 (host i = address <subnet>.<i+1>), prints "ready" on
// stdout once they exist, and runs until SIGTERM/SIGINT; the devices vanish when it exits.
// Timing: a packet from host i to host j leaves i's uplink after queueing and len/rate, leaves
// j's downlink after queueing and len/rate, and is delivered `latency` later. A link's queue
// beyond --queue-ms at its rate drops the packet, as a switch does.
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <string>
#include <vector>

#include "nn/error.h"
#include "tools/cli_args.h"

namespace {

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "netem_relay: %s\n", msg.c_str());
  std::exit(1);
}

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct Packet {
  int64_t due_ns;
  uint64_t seq;  // FIFO among equal times
  int dst;
  std::vector<uint8_t> data;
  bool operator>(const Packet& o) const { return due_ns != o.due_ns ? due_ns > o.due_ns : seq > o.seq; }
};

struct Options {
  int hosts = 0;
  double rate_bits = 0;
  int64_t latency_ns = 0, queue_ns = 20'000'000;
  std::string subnet = "10.77.0", dev = "rtct";
};

constexpr const char* kUsage =
    "usage: netem_relay --hosts N --rate BITS_PER_S --latency-us L [--subnet 10.77.0] [--dev rtct] [--queue-ms 20]\n";

// A mistake in the command line: status 2, as the other tools (1 is a failure while running).
[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "netem_relay: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (a != "--hosts" && a != "--rate" && a != "--latency-us" && a != "--queue-ms" && a != "--subnet" &&
        a != "--dev")
      usage("unknown flag " + a);
    if (i + 1 >= argc) usage("missing value for " + a);
    const std::string v = argv[++i];
    // Real-valued flags and their ranges: up to 1000 Tbit/s, 1000 s of latency, 1000 s of queue.
    const auto real = [&](double lo, double hi) {
      const auto x = rt::tools::parse_real(v, lo, hi);
      if (!x) usage(a + " takes a number in [" + rt::str_cat(lo) + ", " + rt::str_cat(hi) + "], not '" + v + "'");
      return *x;
    };
    if (a == "--hosts") {
      const auto x = rt::tools::parse_int(v, 1, 250);
      if (!x) usage("--hosts takes an integer in [1, 250], not '" + v + "'");
      o.hosts = int(*x);
    }
    else if (a == "--rate") o.rate_bits = real(8000, 1e15);
    else if (a == "--latency-us") o.latency_ns = int64_t(real(0, 1e9) * 1000);
    else if (a == "--queue-ms") o.queue_ns = int64_t(real(0, 1e6) * 1e6);
    else if (a == "--subnet") o.subnet = v;
    else o.dev = v;
  }
  if (!o.hosts || !o.rate_bits) usage("--hosts and --rate are required");
  return o;
}

int open_tun(const std::string& name) {
  const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) die("open /dev/net/tun: " + std::string(std::strerror(errno)));
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name.c_str());
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) die("create " + name + ": " + std::strerror(errno));
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  unsigned a = 0, b = 0, c = 0;
  if (std::sscanf(o.subnet.c_str(), "%u.%u.%u", &a, &b, &c) != 3 || a > 255 || b > 255 || c > 255)
    die("--subnet must be three octets, e.g. 10.77.0");
  const int n = o.hosts;
  std::vector<int> fds(n);
  for (int i = 0; i < n; ++i) fds[i] = open_tun(o.dev + std::to_string(i));
  const int timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer < 0) die("timerfd_create: " + std::string(std::strerror(errno)));
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::printf("ready\n");
  std::fflush(stdout);

  const double ns_per_byte = 8e9 / o.rate_bits;
  std::vector<int64_t> up_free(n, 0), down_free(n, 0);
  std::priority_queue<Packet, std::vector<Packet>, std::greater<Packet>> line;
  std::vector<pollfd> pfd(n + 1);
  for (int i = 0; i < n; ++i) pfd[i] = {fds[i], POLLIN, 0};
  pfd[n] = {timer, POLLIN, 0};
  std::vector<uint8_t> buf(65536);
  uint64_t seq = 0, dropped = 0;
  int64_t armed = -1;

  while (!g_stop) {
    if (poll(pfd.data(), pfd.size(), -1) < 0) {
      if (errno == EINTR) continue;
      die("poll: " + std::string(std::strerror(errno)));
    }
    const int64_t t = now_ns();
    for (int i = 0; i < n; ++i) {
      if (!(pfd[i].revents & POLLIN)) continue;
      for (;;) {  // drain this device
        const ssize_t len = read(fds[i], buf.data(), buf.size());
        if (len <= 0) break;
        if (len < 20 || (buf[0] >> 4) != 4) continue;  // IPv4 only
        if (buf[16] != a || buf[17] != b || buf[18] != c) continue;
        const int dst = int(buf[19]) - 1;
        if (dst < 0 || dst >= n || dst == i) continue;
        const int64_t ser = int64_t(double(len) * ns_per_byte);
        const int64_t up_start = std::max(t, up_free[i]);
        if (up_start - t > o.queue_ns) { ++dropped; continue; }  // uplink queue full
        const int64_t at_switch = up_start + ser;
        const int64_t down_start = std::max(at_switch, down_free[dst]);
        if (down_start - at_switch > o.queue_ns) { ++dropped; continue; }  // downlink queue full
        up_free[i] = at_switch;
        down_free[dst] = down_start + ser;
        line.push(Packet{down_free[dst] + o.latency_ns, seq++, dst,
                         std::vector<uint8_t>(buf.begin(), buf.begin() + len)});
      }
    }
    if (pfd[n].revents & POLLIN) {
      uint64_t expirations;
      while (read(timer, &expirations, sizeof expirations) > 0) {}
      armed = -1;
    }
    const int64_t t2 = now_ns();
    while (!line.empty() && line.top().due_ns <= t2) {
      const Packet& p = line.top();
      if (write(fds[p.dst], p.data.data(), p.data.size()) < 0 && errno != EAGAIN) ++dropped;
      line.pop();
    }
    if (!line.empty() && line.top().due_ns != armed) {
      armed = line.top().due_ns;
      itimerspec its{};
      its.it_value.tv_sec = armed / 1000000000;
      its.it_value.tv_nsec = armed % 1000000000;
      timerfd_settime(timer, TFD_TIMER_ABSTIME, &its, nullptr);
    }
  }
  std::fprintf(stderr, "netem_relay: stopped (%llu packets dropped)\n", (unsigned long long)dropped);
  return 0;
}
