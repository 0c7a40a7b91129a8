/*
 * posix_write.c — the baseline for bench/ckpt_bandwidth.sh: every rank writes its share of
 * the bytes (the same share it writes in a checkpoint) with plain pwrite() into one shared
 * file at disjoint offsets, all ranks close, then rank 0 fsyncs the file — the same
 * durability point as ckpt_save. Prints the best and the median of REPS runs in MB/s.
 *
 *   mpiexec -n P posix_write FILE BYTES0,BYTES1,... REPS
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <mpi.h>

#define BLOCK (4u << 20) /* bytes per write() call */

/* Write `bytes` from buf at `off` in BLOCK pieces; 0 or -1 (errno set). */
static int write_all(int fd, const char *buf, size_t bytes, off_t off) {
    size_t done = 0;
    while (done < bytes) {
        size_t n = bytes - done < BLOCK ? bytes - done : BLOCK;
        ssize_t w = pwrite(fd, buf + done % BLOCK, n, off + (off_t)done);
        if (w <= 0) return -1;
        done += (size_t)w;
    }
    return 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 4) {
        if (rank == 0) fprintf(stderr, "usage: posix_write FILE BYTES0,BYTES1,... REPS\n");
        MPI_Finalize();
        return 2;
    }
    /* this rank's share and offset */
    double mine = 0, before = 0, total = 0;
    const char *p = argv[2];
    for (int r = 0; *p; r++) {
        double b = strtod(p, (char **)&p);
        if (r < rank) before += b;
        if (r == rank) mine = b;
        total += b;
        if (*p == ',') p++;
    }
    char *buf = malloc(BLOCK);
    for (size_t i = 0; i < BLOCK; i++) buf[i] = (char)(i * 131 + rank);
    int reps = atoi(argv[3]) > 0 ? atoi(argv[3]) : 1, bad = 0;
    double *ts = calloc((size_t)reps, sizeof(double));
    for (int k = 0; k < reps; k++) {
        if (rank == 0) unlink(argv[1]);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        int fd = open(argv[1], O_WRONLY | O_CREAT, 0644);
        if (fd < 0 || write_all(fd, buf, (size_t)mine, (off_t)before) != 0) {
            fprintf(stderr, "rank %d: writing %s: %s\n", rank, argv[1], strerror(errno));
            bad = 1;
        }
        if (fd >= 0) close(fd);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) { /* durability point, as in ckpt_save */
            fd = open(argv[1], O_RDONLY);
            if (fd < 0 || fsync(fd) != 0) bad = 1;
            if (fd >= 0) close(fd);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        ts[k] = MPI_Wtime() - t0;
    }
    for (int i = 1; i < reps; i++) /* sort the times */
        for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) {
            double t = ts[j];
            ts[j] = ts[j - 1];
            ts[j - 1] = t;
        }
    double best = ts[0], med = reps % 2 ? ts[reps / 2] : 0.5 * (ts[reps / 2 - 1] + ts[reps / 2]);
    int anybad;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && !anybad)
        printf("posix ranks=%d bytes=%.0f seconds=%.4f MBps=%.1f median_MBps=%.1f\n", size, total, best,
               total / best / 1e6, total / med / 1e6);
    if (rank == 0) unlink(argv[1]);
    free(buf);
    free(ts);
    MPI_Finalize();
    return anybad;
}
