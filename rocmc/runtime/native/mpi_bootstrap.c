/* The bootstrap IREE's runtime asks of MPI, answered by rocmc's process group.
 *
 * IREE's CUDA and HIP drivers create a collective channel (an NCCL or RCCL communicator) from a
 * "channel provider"; the one the runtime installs on a device when the environment names a world
 * size (PMI_SIZE) loads "libmpi.so" and uses three things of it: this process's rank, the world size,
 * and a broadcast of the communicator's 128-byte unique id from rank 0. rocmc loads this library under
 * that name before it opens the device and answers them from its own launcher's process group
 * (rocmc/runtime/distributed.py): the rank and size it was started with, and the broadcast through its
 * rendezvous. Nothing else of MPI is provided: every other entry point reports an error.
 *
 * The ABI is Open MPI's (handles are the addresses of exported objects), the one IREE's loader assumes
 * on Linux. Built by rocmc at first use (rocmc/runtime/native/__init__.py).
 */
#include <stddef.h>
#include <string.h>

#define MPI_SUCCESS 0
#define MPI_ERR_OTHER 16

typedef int (*rocmc_broadcast_fn)(void* buffer, int bytes, int root);

static int g_rank = 0;
static int g_size = 1;
static int g_initialized = 0;
static rocmc_broadcast_fn g_broadcast = NULL;

/* Open MPI's handles: IREE only compares and passes their addresses. */
#define HANDLE(name) char name[64]
HANDLE(ompi_mpi_comm_world);
HANDLE(ompi_mpi_byte);
HANDLE(ompi_mpi_int);
HANDLE(ompi_mpi_float);
HANDLE(ompi_mpi_double);
HANDLE(ompi_mpi_op_max);
HANDLE(ompi_mpi_op_min);
HANDLE(ompi_mpi_op_sum);
HANDLE(ompi_mpi_op_prod);
HANDLE(ompi_mpi_op_land);
HANDLE(ompi_mpi_op_band);
HANDLE(ompi_mpi_op_lor);
HANDLE(ompi_mpi_op_bor);
HANDLE(ompi_mpi_op_lxor);
HANDLE(ompi_mpi_op_bxor);
HANDLE(ompi_mpi_op_maxloc);
HANDLE(ompi_mpi_op_minloc);
HANDLE(ompi_mpi_op_replace);
HANDLE(ompi_mpi_op_no_op);

/* Set by rocmc before the device is created. */
int rocmc_bootstrap_configure(int rank, int size, rocmc_broadcast_fn broadcast) {
  if (size < 1 || rank < 0 || rank >= size || broadcast == NULL) return MPI_ERR_OTHER;
  g_rank = rank;
  g_size = size;
  g_broadcast = broadcast;
  return MPI_SUCCESS;
}

int MPI_Init(int* argc, char*** argv) {
  (void)argc; (void)argv;
  if (g_broadcast == NULL) return MPI_ERR_OTHER;   /* loaded but never configured by rocmc */
  g_initialized = 1;
  return MPI_SUCCESS;
}

int MPI_Initialized(int* flag) { *flag = g_initialized; return MPI_SUCCESS; }

int MPI_Finalize(void) { g_initialized = 0; return MPI_SUCCESS; }

int MPI_Comm_rank(void* comm, int* rank) {
  if (comm != (void*)ompi_mpi_comm_world) return MPI_ERR_OTHER;
  *rank = g_rank;
  return MPI_SUCCESS;
}

int MPI_Comm_size(void* comm, int* size) {
  if (comm != (void*)ompi_mpi_comm_world) return MPI_ERR_OTHER;
  *size = g_size;
  return MPI_SUCCESS;
}

int MPI_Bcast(void* buffer, int count, void* datatype, int root, void* comm) {
  if (comm != (void*)ompi_mpi_comm_world || datatype != (void*)ompi_mpi_byte || count < 0 ||
      root < 0 || root >= g_size || g_broadcast == NULL)
    return MPI_ERR_OTHER;
  return g_broadcast(buffer, count, root) == 0 ? MPI_SUCCESS : MPI_ERR_OTHER;
}

int MPI_Error_class(int code, int* error_class) { *error_class = code; return MPI_SUCCESS; }

int MPI_Error_string(int code, char* string, int* length) {
  const char* text = code == MPI_SUCCESS ? "success"
                                         : "not provided by rocmc's bootstrap (rank, size and broadcast only)";
  strcpy(string, text);
  *length = (int)strlen(text);
  return MPI_SUCCESS;
}

/* Entry points IREE resolves but its channel provider does not call. */
int MPI_Comm_split(void* comm, int color, int key, void** out) {
  (void)comm; (void)color; (void)key; (void)out; return MPI_ERR_OTHER; }
int MPI_Gather(void* a, int b, void* c, void* d, int e, void* f, int g, void* h) {
  (void)a; (void)b; (void)c; (void)d; (void)e; (void)f; (void)g; (void)h; return MPI_ERR_OTHER; }
int MPI_Scatter(void* a, int b, void* c, void* d, int e, void* f, int g, void* h) {
  (void)a; (void)b; (void)c; (void)d; (void)e; (void)f; (void)g; (void)h; return MPI_ERR_OTHER; }
int MPI_Allgather(void* a, int b, void* c, void* d, int e, void* f, void* g) {
  (void)a; (void)b; (void)c; (void)d; (void)e; (void)f; (void)g; return MPI_ERR_OTHER; }
int MPI_Alltoall(void* a, int b, void* c, void* d, int e, void* f, void* g) {
  (void)a; (void)b; (void)c; (void)d; (void)e; (void)f; (void)g; return MPI_ERR_OTHER; }
int MPI_Reduce(void* a, void* b, int c, void* d, void* e, int f, void* g) {
  (void)a; (void)b; (void)c; (void)d; (void)e; (void)f; (void)g; return MPI_ERR_OTHER; }
int MPI_Allreduce(void* a, void* b, int c, void* d, void* e, void* f) {
  (void)a; (void)b; (void)c; (void)d; (void)e; (void)f; return MPI_ERR_OTHER; }
