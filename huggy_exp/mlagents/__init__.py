"""Unity ML-Agents file formats, one module per concern (docs/architecture.md); the public names are re-exported here."""

from huggy_exp.mlagents.checkpoint import load_checkpoint, save_checkpoint, weights_from_state_dict
from huggy_exp.mlagents.default import (DEFAULT_STEP, DEFAULT_VERSION, cache_dir, default_results_dir, default_weights,
                                        load_default)
from huggy_exp.mlagents.heads import with_distributions
from huggy_exp.mlagents.hub import fetch_hub
from huggy_exp.mlagents.onnx_read import check_onnx_pairing, load_onnx, read_onnx, weights_from_onnx, with_parts
from huggy_exp.mlagents.onnx_write import interface, write_onnx
from huggy_exp.mlagents.results import (configuration_mismatches, latest_checkpoint, list_checkpoints,
                                        model_configuration, model_files, read_configuration, results_model, run_folder)
from huggy_exp.mlagents.weights import (ACTION_CLAMP, ACTION_MASKS, LOG_SIGMA_RANGE, MASK_PENALTY, NORMALIZER_CLAMP,
                                        ONNX_INPUT, RECURRENT_IN, RECURRENT_OUT, LoadedModel, Lstm, Normalizer,
                                        PolicyWeights, obs_name, sha256_file)
