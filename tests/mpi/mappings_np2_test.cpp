// Adjoint pairs and tensor-parallel layers on 2 ranks (see mappings_cases.h).
#include "mappings_cases.h"
