/* tandem-decode: the decode worker (and, with --colocated, a worker that
 * prefills and decodes whole requests). */
#include "decode.h"
#include "worker.h"

int main(int argc, char **argv)
{
    return worker_main(argc, argv, "tandem-decode", &decode_role, &colocated_role);
}
