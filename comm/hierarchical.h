// The hierarchical allreduce's placement rule, as plain arithmetic (the algorithm itself is in
// hierarchical.cc, made by make_allreducer under the name "hierarchical").
#pragma once
#include <string>
#include <vector>

namespace rt::comm {

// node_of[r]: the lowest rank of rank r's node. Empty when every node holds the same number of
// ranks (the cross-node rings pair local rank l of every node); otherwise what is wrong, each
// node named by its lowest rank and its rank count, the same text on every rank.
std::string hierarchical_placement_error(const std::vector<int>& node_of);

}  // namespace rt::comm
