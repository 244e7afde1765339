"""Unity ML-Agents file formats, one module per concern; the public names are re-exported here.

weights      weights and normalizer types, ML-Agents' key names and constants, shared checks
checkpoint   .pt reading (torch.load weights_only) and writing
onnx_graph   lookups over an ONNX graph shared by the readers
onnx_read    .onnx graphs read by structure (inputs, normalizers, MLP, LSTM)
heads        the action heads' ONNX patterns, read and written (continuous PPO/SAC, discrete branches)
onnx_write   .onnx graphs written with onnx.helper, as ML-Agents' exporter lays them out
results      results folders, run_logs/training_status.json, configuration.yaml
default      the embedded synthetic default
hub          the Hugging Face Hub
"""

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
