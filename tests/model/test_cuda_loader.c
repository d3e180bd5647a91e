/* test_cuda_loader.c - runtime/cuda/cuda_loader.c accepts only a module built from the
 * same headers: ABI number and struct layout (cuda_module.h). Each case runs in a child
 * process, since the loader loads once per process. The fake modules' paths come from
 * the environment (tests/model/meson.build). */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fmoe/cuda.h"
#include "fmoe/error.h"
#include "harness.h"

/* In a child: load `module`; exit 0 when the device count is `want` (>= 0), or, for
 * want < 0, when loading fails with a detail containing `detail`. */
static int child_loads(const char *module, int want, const char *detail) {
    const pid_t pid = fork();
    if (pid == 0) {
        setenv("FMOE_CUDA_MODULE", module, 1);
        if (want >= 0) _exit(fmoe_cuda_device_count() == want ? 0 : 1);
        const int rc = fmoe_cuda_selftest(1);
        _exit(rc < 0 && strstr(fmoe_error_detail(), detail) ? 0 : 2);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static const char *fake(const char *name) {
    const char *p = getenv(name);
    return p ? p : "";
}

TEST(a_module_from_the_same_headers_loads) {
    ASSERT_EQ(child_loads(fake("FAKE_CUDA_MODULE_OK"), 3, NULL), 0);
}

TEST(a_module_of_another_abi_is_refused) {
    ASSERT_EQ(child_loads(fake("FAKE_CUDA_MODULE_ABI"), -1, ", this binary needs ABI"), 0);
}

TEST(a_module_from_other_headers_is_refused_naming_the_layout) {
    ASSERT_EQ(child_loads(fake("FAKE_CUDA_MODULE_LAYOUT"), -1, "backend struct layout"), 0);
}

int main(int argc, char **argv) {
    if (!fmoe_cuda_compiled()) return 77; /* the loader only loads in a CUDA build */
    return RUN_TESTS(argc, argv);
}
