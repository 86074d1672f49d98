/* A fake CUDA driver (libcuda.so.1) for hwpool's tests: the five entry points hwpool's probe
 * calls, answering from the environment as the real driver would from the hardware.
 *
 * FAKE_CUDA_DEVICES: the devices the driver enumerates, in its order: comma-separated UUIDs
 *   (32 hex digits, dashes ignored); unset or empty: none.
 * FAKE_CUDA_INIT: the CUresult cuInit returns (default 0, CUDA_SUCCESS).
 * FAKE_CUDA_LOG: a file each cuInit appends "cuInit <pid>" to, to see who initialised CUDA.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct { unsigned char bytes[16]; } CUuuid;

static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The n-th device's UUID into out; 0 if there is one. */
static int nth(int n, unsigned char out[16]) {
    const char *list = getenv("FAKE_CUDA_DEVICES");
    int index = 0, digits = 0;
    if (list == NULL) return -1;
    for (const char *p = list; ; p++) {
        if (*p == ',' || *p == '\0') {
            if (digits == 32 && index == n) return 0;
            if (digits > 0) index++;
            digits = 0;
            if (*p == '\0') return -1;
        } else if (hex(*p) >= 0 && digits < 32) {
            if (index == n) {
                if (digits % 2 == 0) out[digits / 2] = (unsigned char)(hex(*p) << 4);
                else out[digits / 2] |= (unsigned char)hex(*p);
            }
            digits++;
        }
    }
}

CUresult cuInit(unsigned int flags) {
    const char *log = getenv("FAKE_CUDA_LOG");
    const char *status = getenv("FAKE_CUDA_INIT");
    (void)flags;
    if (log != NULL) {
        FILE *f = fopen(log, "a");
        if (f != NULL) { fprintf(f, "cuInit %d\n", (int)getpid()); fclose(f); }
    }
    return status == NULL ? 0 : atoi(status);
}

CUresult cuDeviceGetCount(int *count) {
    unsigned char scratch[16];
    int n = 0;
    while (nth(n, scratch) == 0) n++;
    *count = n;
    return 0;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    unsigned char scratch[16];
    if (nth(ordinal, scratch) != 0) return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *device = ordinal;
    return 0;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice device) {
    return nth(device, uuid->bytes) == 0 ? 0 : 101;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice device) {
    return cuDeviceGetUuid_v2(uuid, device);
}
