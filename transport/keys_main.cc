// tessera-keys: makes a job key pair file (transport/job_keys.h) for
// ZeroMQ CURVE authentication. The launcher runs it for every job unless
// security.curve is false or security.keys_file names a file of one's own.
#include <iostream>

#include "transport/job_keys.h"

int main(int argc, char** argv) {
  if (argc != 2 || argv[1][0] == '-') {
    std::cerr << "usage: tessera-keys FILE\n"
                 "Writes a new CURVE key pair for one job to FILE (mode 0600; an existing FILE is refused).\n"
                 "Every process of the job is given it with the flag --job_keys FILE (docs/security.md).\n";
    return 2;
  }
  auto keys = tessera::WriteNewJobKeys(argv[1]);
  if (!keys.ok()) {
    std::cerr << "tessera-keys: " << keys.status().message() << "\n";
    return 1;
  }
  std::cout << argv[1] << ": public key " << keys->public_key << "\n";
  return 0;
}
