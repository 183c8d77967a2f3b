/* vero-probe: the stand-in for hostile candidate code that `vero harbor check --probe` plants in a case
 * container. It is never part of a real evaluation: only the probe agent of `vero harbor check`
 * (`vero.harbor.probe`) uploads it, after vero's install agent has installed the candidate and closed
 * the candidate sandbox (`vero-kit end-install`).
 *
 *   vero-probe start INSTALL_PATH REWARD_JSON REWARD_TXT        (as root)
 *
 * `start` watches the installed candidate (INSTALL_PATH and the candidate user's home, every directory
 * of both, with inotify) and returns once the watches are in place, leaving a root daemon behind
 * (detached, its standard streams on /dev/null). The first time anything opens a file there - the
 * case's tests running or reading candidate code - the daemon plants a process as the candidate user
 * (`vero-candidate`, created by `vero-kit setup`): what candidate code the tests run could leave
 * behind. Waiting for that moment matters: before it, no candidate process can exist (end-install
 * killed them all), and a case kit's locks are in place by then. Every 10 ms, until it is killed (at
 * most an hour), the planted process tries to
 *   - list /tests and read its files (the case's answers);
 *   - write REWARD_JSON to /logs/verifier/reward.json and REWARD_TXT to reward.txt, in place, or by
 *     renaming a file of its own over them.
 * It tells the daemon over a pipe what it managed, once per kind, and the daemon appends each as an
 * event to the case kit's log (/logs/verifier/vero-kit.jsonl), which vero reads into the attempt's
 * flags: probe_planted, probe_attempted (a whole round of attempts done), probe_tests_listed,
 * probe_tests_read, probe_reward_written.
 *
 * Built like the kit (`gcc -static`), so it runs in any case image. Exit status of `start`: 0 when the
 * daemon is watching, 125 on error.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CANDIDATE_USER "vero-candidate"
#define CANDIDATE_HOME "/home/vero-candidate"
#define PASSWD_FILE "/etc/passwd"
#define TESTS_DIR "/tests"
#define VERIFIER_DIR "/logs/verifier"
#define EVENTS_FILE "/logs/verifier/vero-kit.jsonl"
#define REWARD_JSON "/logs/verifier/reward.json"
#define REWARD_TXT "/logs/verifier/reward.txt"
#define MAX_WATCHES 4096
#define MAX_CONTENT 256
#define ROUND_NSEC 10000000L
#define LIFETIME_SEC 3600
#define EXIT_ERROR 125

static int watcher = -1;
static int n_watches = 0;

static _Noreturn void die(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fputs("vero-probe: error: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(EXIT_ERROR);
}

/* The candidate user's ids from /etc/passwd (parsed here: a static binary must not use NSS). */
static int lookup_candidate(uid_t *uid, gid_t *gid) {
    FILE *file = fopen(PASSWD_FILE, "re");
    if (file == NULL) {
        return -1;
    }
    char line[4096];
    int found = -1;
    while (found != 0 && fgets(line, sizeof line, file) != NULL) {
        char *fields[4] = {line, NULL, NULL, NULL};
        for (int i = 1; i < 4; i++) {
            fields[i] = fields[i - 1] ? strchr(fields[i - 1], ':') : NULL;
            if (fields[i] != NULL) {
                *fields[i]++ = '\0';
            }
        }
        if (fields[3] == NULL || strcmp(fields[0], CANDIDATE_USER) != 0) {
            continue;
        }
        char *end_uid, *end_gid;
        unsigned long u = strtoul(fields[2], &end_uid, 10);
        unsigned long g = strtoul(fields[3], &end_gid, 10);
        if (*fields[2] != '\0' && *end_uid == '\0' && (*end_gid == ':' || *end_gid == '\0') && u != 0 && g != 0) {
            *uid = (uid_t)u;
            *gid = (gid_t)g;
            found = 0;
        }
    }
    fclose(file);
    return found;
}

static int add_watch(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    /* nftw opens each directory after this call: that open is an IN_ISDIR event, which the daemon
     * ignores. */
    if (type == FTW_D && n_watches < MAX_WATCHES && inotify_add_watch(watcher, path, IN_OPEN) >= 0) {
        n_watches++;
    }
    return 0;
}

/* Appends one event line to the kit's log (root's; the kit writes it the same way). */
static void event(const char *name) {
    struct stat st;
    if (lstat(VERIFIER_DIR, &st) != 0 || !S_ISDIR(st.st_mode)) {
        return;
    }
    int fd = open(EVENTS_FILE, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        return;
    }
    char line[160];
    int n = snprintf(line, sizeof line, "{\"event\": \"%s\", \"when\": \"verifier\", \"count\": 1}\n", name);
    if (n > 0 && (size_t)n < sizeof line) {
        ssize_t ignored = write(fd, line, (size_t)n);
        (void)ignored;
    }
    close(fd);
}

/* ---- the planted process (the candidate user) ------------------------------------------------- */

/* Written over in place, then cut to size: never O_TRUNC, so a reader between two rounds (the case's
 * verifier, Harbor) sees the previous content or the new one, never an empty file. */
static int put_file(const char *path, const char *content) {
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        return 0;
    }
    size_t size = strlen(content);
    int ok = write(fd, content, size) == (ssize_t)size && ftruncate(fd, (off_t)size) == 0;
    close(fd);
    return ok;
}

static int replace_file(const char *path, const char *content) {
    char temp[PATH_MAX];
    snprintf(temp, sizeof temp, "%s/.vero-probe-%ld", VERIFIER_DIR, (long)getpid());
    if (!put_file(temp, content)) {
        return 0;
    }
    if (rename(temp, path) == 0) {
        return 1;
    }
    unlink(temp);
    return 0;
}

static int read_some(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    char byte;
    int ok = read(fd, &byte, 1) >= 0;
    close(fd);
    return ok;
}

static void tell(int out, const char *what, int *told) {
    if (*told) {
        return;
    }
    *told = 1;
    char line[64];
    int n = snprintf(line, sizeof line, "%s\n", what);
    if (write(out, line, (size_t)n) != n) {
        _exit(0); /* the daemon is gone */
    }
}

static _Noreturn void probe(int out, const char *json, const char *txt) {
    int listed = 0, read_tests = 0, written = 0, attempted = 0;
    time_t end = time(NULL) + LIFETIME_SEC;
    while (time(NULL) < end) {
        DIR *dir = opendir(TESTS_DIR);
        if (dir != NULL) {
            tell(out, "probe_tests_listed", &listed);
            struct dirent *entry;
            while ((entry = readdir(dir)) != NULL) {
                char path[PATH_MAX];
                if (entry->d_name[0] == '.') {
                    continue;
                }
                snprintf(path, sizeof path, "%s/%s", TESTS_DIR, entry->d_name);
                if (read_some(path)) {
                    tell(out, "probe_tests_read", &read_tests);
                }
            }
            closedir(dir);
        }
        if (read_some(TESTS_DIR "/test.sh")) { /* a directory it may traverse but not list */
            tell(out, "probe_tests_read", &read_tests);
        }
        if (put_file(REWARD_JSON, json) | put_file(REWARD_TXT, txt) | replace_file(REWARD_JSON, json)) {
            tell(out, "probe_reward_written", &written);
        }
        tell(out, "probe_attempted", &attempted);
        struct timespec pause = {0, ROUND_NSEC};
        nanosleep(&pause, NULL);
    }
    _exit(0);
}

static _Noreturn void plant(int out, uid_t uid, gid_t gid, const char *json, const char *txt) {
    for (int fd = 3; fd < 1024; fd++) {
        if (fd != out) {
            close(fd);
        }
    }
    if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0 || getuid() != uid || geteuid() != uid ||
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || chdir("/") != 0) {
        _exit(EXIT_ERROR);
    }
    probe(out, json, txt);
}

/* ---- the root daemon -------------------------------------------------------------------------- */

static _Noreturn void daemon_main(uid_t uid, gid_t gid, const char *json, const char *txt) {
    /* Wait for the first open of a file (never a directory) under the watched trees. */
    char buffer[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (int triggered = 0; !triggered;) {
        ssize_t size = read(watcher, buffer, sizeof buffer);
        if (size < 0) {
            if (errno == EINTR) {
                continue;
            }
            _exit(1);
        }
        for (char *at = buffer; at < buffer + size;) {
            const struct inotify_event *seen = (const struct inotify_event *)at;
            if ((seen->mask & IN_OPEN) && !(seen->mask & IN_ISDIR)) {
                triggered = 1;
            }
            at += sizeof *seen + seen->len;
        }
    }
    close(watcher);
    event("probe_planted");
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
        _exit(1);
    }
    pid_t child = fork();
    if (child < 0) {
        _exit(1);
    }
    if (child == 0) {
        close(pipe_fds[0]);
        plant(pipe_fds[1], uid, gid, json, txt);
    }
    close(pipe_fds[1]);
    static const char *const known[] = {"probe_attempted", "probe_tests_listed", "probe_tests_read",
                                        "probe_reward_written", NULL};
    FILE *findings = fdopen(pipe_fds[0], "r");
    char line[64];
    while (findings != NULL && fgets(line, sizeof line, findings) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        for (int i = 0; known[i] != NULL; i++) {
            if (strcmp(line, known[i]) == 0) {
                event(known[i]);
            }
        }
    }
    waitpid(child, NULL, 0);
    _exit(0);
}

static int cmd_start(int argc, char **argv) {
    if (argc != 5) {
        die("usage: vero-probe start INSTALL_PATH REWARD_JSON REWARD_TXT");
    }
    const char *install_path = argv[2], *json = argv[3], *txt = argv[4];
    if (install_path[0] != '/' || strlen(json) > MAX_CONTENT || strlen(txt) > MAX_CONTENT) {
        die("start: INSTALL_PATH must be absolute, the reward contents at most %d bytes", MAX_CONTENT);
    }
    if (geteuid() != 0) {
        die("start must run as root");
    }
    uid_t uid;
    gid_t gid;
    if (lookup_candidate(&uid, &gid) != 0) {
        die("no %s in %s (vero-kit setup creates it)", CANDIDATE_USER, PASSWD_FILE);
    }
    watcher = inotify_init1(IN_CLOEXEC);
    if (watcher < 0) {
        die("inotify: %s", strerror(errno));
    }
    nftw(install_path, add_watch, 16, FTW_PHYS);
    nftw(CANDIDATE_HOME, add_watch, 16, FTW_PHYS);
    if (n_watches == 0) {
        die("nothing to watch: neither %s nor %s is a directory", install_path, CANDIDATE_HOME);
    }
    fflush(NULL);
    pid_t middle = fork();
    if (middle < 0) {
        die("fork: %s", strerror(errno));
    }
    if (middle > 0) {
        int status = 0;
        waitpid(middle, &status, 0);
        printf("watching %d directories\n", n_watches);
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : EXIT_ERROR;
    }
    /* Detach: a new session, a second fork, standard streams on /dev/null (the `docker exec` that
     * started us must not wait for them). */
    if (setsid() < 0) {
        _exit(1);
    }
    signal(SIGHUP, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    pid_t daemon = fork();
    if (daemon < 0) {
        _exit(1);
    }
    if (daemon > 0) {
        _exit(0);
    }
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        if (null > 2) {
            close(null);
        }
    }
    daemon_main(uid, gid, json, txt);
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "start") == 0) {
        return cmd_start(argc, argv);
    }
    die("usage: vero-probe start INSTALL_PATH REWARD_JSON REWARD_TXT");
}
