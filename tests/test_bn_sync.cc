// Synchronised batch norm without MPI: the recursive-doubling schedule as arithmetic, and groups
// of batch norms (and of whole networks) in threads of one process, whose sums a barrier adds,
// against one batch norm (network) over the group's whole batch.
#include <barrier>

#include "comm/bn_sync.h"
#include "nn/resnet.h"
#include "onednn_vs_ref.h"

namespace rt {
namespace {

using comm::RdStep;

// Plays every rank's schedule at once, each vector a multiset of contributions (a count per
// rank): every rank must end with each contribution exactly once, and every message must meet
// the matching receive in its peer's schedule, in order.
TEST(BnSync, RecursiveDoublingGivesEveryRankEveryContributionOnce) {
  for (int size = 1; size <= 13; ++size) {
    SCOPED_TRACE("size " + std::to_string(size));
    std::vector<std::vector<RdStep>> steps;
    for (int r = 0; r < size; ++r) steps.push_back(comm::recursive_doubling_steps(r, size));
    std::vector<std::vector<int>> v(size_t(size), std::vector<int>(size_t(size), 0));
    for (int r = 0; r < size; ++r) v[size_t(r)][size_t(r)] = 1;
    std::vector<size_t> pc(size_t(size), 0);
    // Advance any rank whose next step's partner is at the matching step, until all are done.
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < size; ++r) {
        if (pc[size_t(r)] == steps[size_t(r)].size()) continue;
        const RdStep s = steps[size_t(r)][pc[size_t(r)]];
        ASSERT_GE(s.peer, 0);
        ASSERT_LT(s.peer, size);
        if (pc[size_t(s.peer)] == steps[size_t(s.peer)].size()) continue;
        const RdStep t = steps[size_t(s.peer)][pc[size_t(s.peer)]];
        if (t.peer != r) continue;
        auto& a = v[size_t(r)];
        auto& b = v[size_t(s.peer)];
        if (s.kind == RdStep::exchange) {
          ASSERT_EQ(t.kind, RdStep::exchange);
          for (int i = 0; i < size; ++i) a[size_t(i)] = b[size_t(i)] = a[size_t(i)] + b[size_t(i)];
        } else if (s.kind == RdStep::send_fold) {
          ASSERT_EQ(t.kind, RdStep::recv_fold);
          for (int i = 0; i < size; ++i) b[size_t(i)] += a[size_t(i)];
        } else if (s.kind == RdStep::send_result) {
          ASSERT_EQ(t.kind, RdStep::recv_result);
          b = a;
        } else {
          continue;  // receives move when their sender does
        }
        ++pc[size_t(r)];
        ++pc[size_t(s.peer)];
        moved = true;
      }
    }
    int p = 1;
    while (p * 2 <= size) p *= 2;
    int log2p = 0;
    while ((1 << log2p) < p) ++log2p;
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(pc[size_t(r)], steps[size_t(r)].size()) << "rank " << r << " stuck";
      EXPECT_EQ(v[size_t(r)], std::vector<int>(size_t(size), 1)) << "rank " << r;
      // log2(p) exchanges, plus the fold and the result where the group is not a power of two.
      EXPECT_EQ(steps[size_t(r)].size(), r >= p ? 2u : size_t(log2p) + 2 * (r + p < size));
    }
  }
}

TEST(BnSync, GroupSizesMustDivideTheRanks) {
  EXPECT_EQ(comm::bn_group_error(0, 6), "");
  EXPECT_EQ(comm::bn_group_error(1, 6), "");
  EXPECT_EQ(comm::bn_group_error(3, 6), "");
  EXPECT_EQ(comm::bn_group_error(6, 6), "");
  EXPECT_NE(comm::bn_group_error(4, 6).find("does not divide the job's 6 ranks"), std::string::npos);
  EXPECT_NE(comm::bn_group_error(2, 1).find("does not divide the job's 1 rank into"), std::string::npos);
  EXPECT_NE(comm::bn_group_error(8, 4).find("does not divide"), std::string::npos);
  EXPECT_NE(comm::bn_group_error(-1, 4).find("must be 0"), std::string::npos);
}

// k members in k threads: sum() waits for all, adds their vectors in member order, and hands
// every member the same total, as the MPI version does.
class ThreadGroup {
 public:
  explicit ThreadGroup(int k) : k_(k), bar_(k), parts_(size_t(k)) {
    for (int i = 0; i < k; ++i) members_.push_back(std::make_shared<Member>(this, i));
  }
  std::shared_ptr<BnSync> member(int i) { return members_[size_t(i)]; }
  int calls() const { return calls_; }

 private:
  struct Member final : BnSync {
    Member(ThreadGroup* g, int i) : g(g), i(i) {}
    void sum(double* v, size_t n) override { g->sum(i, v, n); }
    int ranks() const override { return g->k_; }
    ThreadGroup* g;
    int i;
  };
  void sum(int i, double* v, size_t n) {
    parts_[size_t(i)] = {v, n};
    bar_.arrive_and_wait();
    if (i == 0) {
      ++calls_;
      total_.assign(n, 0.0);
      for (const auto& [p, m] : parts_) {
        if (m != n) throw Error("members sum different counts");
        for (size_t j = 0; j < n; ++j) total_[j] += p[j];
      }
    }
    bar_.arrive_and_wait();
    std::copy(total_.begin(), total_.end(), v);
    bar_.arrive_and_wait();
  }

  int k_;
  std::barrier<> bar_;
  std::vector<std::pair<double*, size_t>> parts_;
  std::vector<double> total_;
  std::vector<std::shared_ptr<Member>> members_;
  int calls_ = 0;
};

// Runs f(i) for each member in a thread of its own.
void in_threads(int k, const std::function<void(int)>& f) {
  std::vector<std::thread> t;
  std::vector<std::exception_ptr> err(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i)
    t.emplace_back([&, i] {
      try {
        f(i);
      } catch (...) {
        err[size_t(i)] = std::current_exception();
      }
    });
  for (auto& th : t) th.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

template <class T>
std::vector<T> random_vec(size_t n, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = T(u(g));
  return v;
}

struct BnCase {
  std::string backend;
  Shape member;  // one member's input
  int k;
  bool relu;
  double tol;
};

// One batch norm over k members' batches in k threads equals one over their concatenation:
// outputs, running statistics, input gradients, and the members' gamma/beta gradients summed.
template <class T>
void check_group(const BnCase& c) {
  SCOPED_TRACE(c.backend + " " + c.member.str() + " k " + std::to_string(c.k) + (c.relu ? " relu" : ""));
  const Shape m = c.member, all{m.n * c.k, m.c, m.h, m.w};
  const size_t per = size_t(m.numel()), C = size_t(m.c);
  auto x = random_vec<T>(per * size_t(c.k), 1, -2, 3);
  auto dy = random_vec<T>(per * size_t(c.k), 2);
  auto gamma = random_vec<T>(C, 3, 0.5, 1.5), beta = random_vec<T>(C, 4);
  auto rm0 = random_vec<T>(C, 5), rv0 = random_vec<T>(C, 6, 0.5, 2);

  // The whole batch on one op.
  auto be = make_backend<T>(c.backend, test::onednn_options());
  auto whole = be->make_batchnorm({.name = "bn", .in = all, .relu = c.relu});
  Buffer<T> ax(size_t(be->act_size(all))), ay(ax.size()), ady(ax.size()), adx(ax.size());
  be->act_import(x.data(), all, ax.data());
  be->act_import(dy.data(), all, ady.data());
  std::vector<T> rm = rm0, rv = rv0, dg(C), db(C);
  whole->forward_train(ax.data(), gamma.data(), beta.data(), ay.data(), rm.data(), rv.data());
  whole->backward(ax.data(), gamma.data(), ay.data(), ady.data(), adx.data(), dg.data(), db.data());
  std::vector<T> y(x.size()), dx(x.size());
  be->act_export(ay.data(), all, y.data());
  be->act_export(adx.data(), all, dx.data());

  ThreadGroup group(c.k);
  std::vector<std::vector<T>> gy(size_t(c.k)), gdx(size_t(c.k)), grm(size_t(c.k)), grv(size_t(c.k)),
      gdg(size_t(c.k), std::vector<T>(C)), gdb(size_t(c.k), std::vector<T>(C));
  std::vector<std::shared_ptr<BnSync>> keep;
  for (int i = 0; i < c.k; ++i) keep.push_back(group.member(i));
  in_threads(c.k, [&](int i) {
    auto b = make_backend<T>(c.backend, test::onednn_options());
    auto op = b->make_batchnorm({.name = "bn", .in = m, .relu = c.relu, .sync = keep[size_t(i)].get()});
    Buffer<T> mx(size_t(b->act_size(m))), my(mx.size()), mdy(mx.size()), mdx(mx.size());
    b->act_import(x.data() + size_t(i) * per, m, mx.data());
    b->act_import(dy.data() + size_t(i) * per, m, mdy.data());
    grm[size_t(i)] = rm0;
    grv[size_t(i)] = rv0;
    op->forward_train(mx.data(), gamma.data(), beta.data(), my.data(), grm[size_t(i)].data(), grv[size_t(i)].data());
    op->backward(mx.data(), gamma.data(), my.data(), mdy.data(), mdx.data(), gdg[size_t(i)].data(),
                 gdb[size_t(i)].data());
    gy[size_t(i)].resize(per);
    gdx[size_t(i)].resize(per);
    b->act_export(my.data(), m, gy[size_t(i)].data());
    b->act_export(mdx.data(), m, gdx[size_t(i)].data());
  });
  EXPECT_EQ(group.calls(), 2 + (c.backend == "reference"));  // forward (the reference: two), backward

  auto near = [&](double a, double b) { return std::abs(a - b) <= c.tol * (1 + std::abs(b)); };
  size_t bad = 0;
  for (int i = 0; i < c.k; ++i) {
    for (size_t j = 0; j < per; ++j) {
      bad += !near(gy[size_t(i)][j], y[size_t(i) * per + j]);
      bad += !near(gdx[size_t(i)][j], dx[size_t(i) * per + j]);
    }
    for (size_t ch = 0; ch < C; ++ch) {
      bad += !near(grm[size_t(i)][ch], rm[ch]);
      bad += !near(grv[size_t(i)][ch], rv[ch]);
    }
  }
  for (size_t ch = 0; ch < C; ++ch) {
    double sg = 0, sb = 0;
    for (int i = 0; i < c.k; ++i) sg += gdg[size_t(i)][ch], sb += gdb[size_t(i)][ch];
    bad += !near(sg, dg[ch]);
    bad += !near(sb, db[ch]);
  }
  EXPECT_EQ(bad, 0u);
  // Every member's running statistics are the same bits: the group's sums are.
  for (int i = 1; i < c.k; ++i) {
    EXPECT_EQ(grm[size_t(i)], grm[0]);
    EXPECT_EQ(grv[size_t(i)], grv[0]);
  }
}

TEST(BnSync, GroupOfBatchNormsEqualsOneOverTheWholeBatch) {
  check_group<double>({"reference", {2, 5, 3, 4}, 3, false, 1e-12});
  check_group<double>({"reference", {1, 6, 2, 2}, 4, true, 1e-12});
  check_group<double>({"reference", {1, 3, 1, 1}, 2, false, 1e-12});  // one value a member
  check_group<float>({"onednn", {2, 16, 5, 3}, 3, false, 2e-5});      // blocked
  check_group<float>({"onednn", {2, 16, 5, 3}, 2, true, 2e-5});
  check_group<float>({"onednn", {3, 12, 4, 4}, 2, true, 2e-5});       // plain
  check_group<float>({"onednn", {1, 8, 1, 1}, 4, false, 2e-5});       // (n, c, 1, 1): plain
}

// One value per channel cannot train alone (PyTorch refuses it too); in a group of two it can
// (the {1, 3, 1, 1} case above).
TEST(BnSync, OneValuePerChannelTrainsOnlyInAGroup) {
  auto be = make_backend<double>("reference");
  EXPECT_THROW(be->make_batchnorm({.name = "bn", .in = {1, 2, 1, 1}})->forward_train(
                   std::vector<double>(2).data(), std::vector<double>(2, 1).data(), std::vector<double>(2).data(),
                   std::vector<double>(2).data(), std::vector<double>(2).data(), std::vector<double>(2).data()),
               ShapeError);
}

// Whole networks: k members of batch b in threads, each with its slice, against one network of
// batch k*b. The members' mean loss is the whole batch's loss, their mean gradient its gradient
// (what the gradient reducer hands the optimizer), and their running statistics its.
template <class T>
void check_nets(const std::string& backend, const std::string& model, double tol) {
  SCOPED_TRACE(backend + " " + model);
  const int k = 3, b = 2;
  ResNetConfig cfg{.name = model, .num_classes = 5, .image_size = 8, .batch = k * b, .width = 0.25,
                   .loss = {.label_smoothing = 0.1}, .seed = 11};
  auto whole = build_resnet<T>(cfg, make_backend<T>(backend, test::onednn_options()));
  const size_t per = size_t(whole->shape(0).numel()) / size_t(k);
  auto x = random_vec<T>(per * size_t(k), 7);
  std::vector<int32_t> labels(size_t(k * b));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t((i * 3) % 5);
  const double loss = whole->forward(x.data(), labels.data(), true);
  whole->backward();
  auto& wa = whole->arena();

  ThreadGroup group(k);
  cfg.batch = b;
  const size_t members = static_cast<size_t>(k);
  std::vector<double> losses(members);
  std::vector<std::vector<T>> grads(members), state(members);
  in_threads(k, [&](int i) {
    ResNetConfig c = cfg;
    c.bn_sync = group.member(i);
    auto net = build_resnet<T>(c, make_backend<T>(backend, test::onednn_options()));
    losses[size_t(i)] = net->forward(x.data() + size_t(i) * per, labels.data() + i * b, true);
    net->backward();
    grads[size_t(i)].assign(net->arena().grads().begin(), net->arena().grads().end());
    state[size_t(i)].assign(net->arena().state().begin(), net->arena().state().end());
  });
  double mean_loss = 0;
  for (double l : losses) mean_loss += l / k;
  EXPECT_NEAR(mean_loss, loss, tol * (1 + std::abs(loss)));
  size_t bad = 0, checked = 0;
  for (size_t j = 0; j < wa.size(); ++j) {
    double g = 0;
    for (int i = 0; i < k; ++i) g += double(grads[size_t(i)][j]) / k;
    bad += std::abs(g - double(wa.grads()[j])) > tol * (1 + std::abs(double(wa.grads()[j])));
    ++checked;
  }
  EXPECT_EQ(bad, 0u) << "of " << checked << " gradient values";
  for (int i = 0; i < k; ++i)
    for (size_t j = 0; j < state[0].size(); ++j)
      ASSERT_NEAR(double(state[size_t(i)][j]), double(wa.state()[j]), tol * (1 + std::abs(double(wa.state()[j]))))
          << "state " << j << " of member " << i;
}

TEST(BnSync, GroupOfNetworksTrainsAsOneOverTheWholeBatch) {
  check_nets<double>("reference", "resnet20", 1e-10);
  check_nets<float>("onednn", "resnet20", 5e-4);
}

// Without the group, the members' batch norms see only their own batch: the check above fails.
TEST(BnSync, WithoutTheGroupMembersDiffer) {
  const int k = 2, b = 2;
  ResNetConfig cfg{.name = "resnet20", .num_classes = 5, .image_size = 8, .batch = k * b, .width = 0.25, .seed = 11};
  auto whole = build_resnet<double>(cfg, make_backend<double>("reference"));
  const size_t per = size_t(whole->shape(0).numel()) / size_t(k);
  auto x = random_vec<double>(per * size_t(k), 7);
  std::vector<int32_t> labels = {0, 1, 2, 3};
  const double loss = whole->forward(x.data(), labels.data(), true);
  cfg.batch = b;
  double mean = 0;
  for (int i = 0; i < k; ++i) {
    auto net = build_resnet<double>(cfg, make_backend<double>("reference"));
    mean += net->forward(x.data() + size_t(i) * per, labels.data() + i * b, true) / k;
  }
  EXPECT_GT(std::abs(mean - loss), 1e-6);
}

}  // namespace
}  // namespace rt
