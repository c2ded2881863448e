/* The streamed-path renderer before it appended JSON text directly: the
 * jansson DOM that oa_output_begin, oa_output_chunk and oa_output_finish
 * built and dumped, as the reference the new one must equal byte for byte.
 * Same contracts as those three (openai.h), on the same struct oa_output:
 * run a reference and a new output side by side on the same tokens.
 * Test and bench only (oa_ref.c says how to link it). */
#ifndef TANDEM_OA_REF_H
#define TANDEM_OA_REF_H

#include "openai.h"

int oa_ref_begin(struct oa_output *o, char **json);
int oa_ref_chunk(struct oa_output *o, char **json);
int oa_ref_finish(struct oa_output *o, enum oa_finish reason, int prompt_tokens, int cached_tokens,
                  char **body, char **usage_chunk);

#endif
