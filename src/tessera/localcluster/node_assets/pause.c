/* The pod sandbox ("pause") process of locally built test images: PID 1 of every pod's
 * sandbox container. It holds the pod's namespaces, reaps orphaned children and exits 0 on
 * SIGINT/SIGTERM. Compiled with `gcc -static` by tessera.localcluster.images (no libc in the
 * image). */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = stop;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    for (;;) pause();
    return 0;
}
