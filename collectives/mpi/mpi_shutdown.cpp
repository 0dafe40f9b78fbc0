#include "lockstep/collectives/mpi/mpi_shutdown.h"

#include <map>
#include <mutex>
#include <utility>

namespace lockstep::collectives::mpi {
namespace {

struct Registry {
  std::mutex mutex;  // held while hooks run (see remove_shutdown_hook)
  std::map<int, std::function<void()>> hooks;
  int next_id = 0;
  // Its own lock: a progress thread may mark while a hook is joining it.
  std::mutex unfinishable_mutex;
  std::string unfinishable;
};

// Never destroyed: hooks may be removed by static destructors that run after
// the finaliser.
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

}  // namespace

int add_shutdown_hook(std::function<void()> hook) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  const int id = r.next_id++;
  r.hooks.emplace(id, std::move(hook));
  return id;
}

void remove_shutdown_hook(int id) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  r.hooks.erase(id);
}

void run_shutdown_hooks() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  // Newest first, like destructors.
  for (auto it = r.hooks.rbegin(); it != r.hooks.rend(); ++it) it->second();
  r.hooks.clear();
}

void mark_unfinishable(const std::string& why) {
  auto& r = registry();
  std::lock_guard lock(r.unfinishable_mutex);
  if (r.unfinishable.empty()) r.unfinishable = why;
}

std::string unfinishable_reason() {
  auto& r = registry();
  std::lock_guard lock(r.unfinishable_mutex);
  return r.unfinishable;
}

}  // namespace lockstep::collectives::mpi
